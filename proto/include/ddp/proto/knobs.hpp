// Knobs: every environment variable a ddprun binary reads, declared once with its type,
// default and one-line doc (NCCL_PARAM's idea). Reads go through here; a unit test fails when
// docs/env_vars.md and this list differ.
#pragma once

#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace ddp::knobs {

enum class Kind : unsigned char { text, integer, seconds, flag01 };

struct Knob {
  std::string_view name;  // exact name; a trailing '*' is a family (PET_*, SLURM_*)
  Kind kind;
  std::string_view fallback;  // the default when unset ("" = none)
  std::string_view readers;   // the binaries that read it
  std::string_view doc;       // one line
};

std::span<const Knob> all();
// The declaration of `name` (a family matches its prefix). Throws std::logic_error for a name
// nobody declared: reading an undeclared variable is a bug caught by the tests.
const Knob& declared(std::string_view name);

using Env = std::map<std::string, std::string>;
// The variable's text from `env` (or the process environment when null), after checking that
// it is declared; nullopt when unset.
std::optional<std::string> text(std::string_view name, const Env* env = nullptr);
// Typed reads with the declared default; a malformed value throws ddp::ConfigError naming it.
std::int64_t integer(std::string_view name, std::int64_t min, std::int64_t max,
                     const Env* env = nullptr);
double seconds(std::string_view name, const Env* env = nullptr);  // in [0, one week]
bool flag01(std::string_view name, const Env* env = nullptr);     // "0" or "1"

}  // namespace ddp::knobs
