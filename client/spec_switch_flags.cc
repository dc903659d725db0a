// The spellings of the job spec's on/off flags (see spec_switch_flags.h).
#include "client/spec_switch_flags.h"

namespace megatrain::client {
namespace {

// "--x" or "-x" -> "x"; anything else -> empty.
std::string_view FlagBody(std::string_view arg) {
  if (arg.starts_with("--")) return arg.substr(2);
  if (arg.starts_with("-")) return arg.substr(1);
  return {};
}

}  // namespace

void SpellOutSpecSwitches(std::vector<std::string>& args) {
  for (std::string& arg : args) {
    if (arg == "--") return;
    const std::string_view body = FlagBody(arg);
    for (std::string_view name : kSpecSwitchFlags) {
      if (body == name) {
        arg = "--" + std::string(name) + "=true";
        break;
      }
      if (body.starts_with("no") && body.substr(2) == name) {
        arg = "--" + std::string(name) + "=false";
        break;
      }
    }
  }
}

}  // namespace megatrain::client
