// The one number parser: whole text, a range, and one error shape for every flag, variable and
// file field: "<what> '<text>' is not an integer", "... is out of range [min, max]",
// "... is not a number of seconds in [min, max]".
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>

namespace ddp {

// Throws ddp::ConfigError naming `what` unless all of `text` is an integer in [min, max].
std::int64_t parse_int(std::string_view text, std::string_view what, std::int64_t min,
                       std::int64_t max);
// A decimal number of seconds in [min_s, max_s] (fractions allowed), as milliseconds.
std::chrono::milliseconds parse_seconds(std::string_view text, std::string_view what,
                                        double min_s = 0, double max_s = 604800);

}  // namespace ddp
