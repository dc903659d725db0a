// The terminal's size (see terminal_size.h).
#include "client/terminal_size.h"

#include <sys/ioctl.h>

#include <cstdio>

namespace megatrain::client {

int TerminalColumns() {
  struct winsize size {};
  if (ioctl(fileno(stdout), TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_col;
}

int TerminalRows() {
  struct winsize size {};
  if (ioctl(fileno(stdout), TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_row;
}

}  // namespace megatrain::client
