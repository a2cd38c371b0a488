// The values of the flags torch 2.12-2.15 added and of ddprun's own (hang detection), parsed
// from the raw flag texts cli.cpp collects. Private to the launcher.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ddp/launch/config.hpp"

namespace ddp::launch {

// A flag the user did not give (its raw text, distinct from an empty value).
inline constexpr const char* kUnset = "\x01unset";

// torch 2.15's comma_separated_list: "a,b" -> {a, b}; ",," is a comma inside an item.
std::vector<std::string> comma_separated_list(const std::string& text);

// --shutdown-timeout, --numa-binding, the duplicate filters, --logs-specs (an error), and
// --hang-timeout, --on-hang, --straggler-factor. Throws ddp::ConfigError naming the flag.
void fill_newer_flags(LaunchConfig& c, const std::map<std::string, std::string>& raw);

}  // namespace ddp::launch
