// The size of the terminal stdout writes to, for redrawn screens (watch's progress line, top).
#pragma once

namespace megatrain::client {

// The terminal's width (asked at every redraw: it may be resized), 0 when unknown.
int TerminalColumns();
// The terminal's height, 0 when unknown.
int TerminalRows();

}  // namespace megatrain::client
