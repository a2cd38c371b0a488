// torchrun's macros, with Python's string.Template.safe_substitute rules (what torchrun uses for
// "${local_rank}" in a script's arguments and for the log line prefix template): "$name" and
// "${name}" are replaced when name is known, "$$" is "$", anything else is left as written.
// Pure.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace ddp::launch {

// With escape = false, "$$" stays "$$" (in a script's arguments it is a shell's PID, and
// torchrun's turning it into "$" breaks `sh -c 'kill $$'`: docs/decisions.md).
std::string safe_substitute(std::string_view text, const std::map<std::string, std::string>& vars,
                            bool escape = true);

}  // namespace ddp::launch
