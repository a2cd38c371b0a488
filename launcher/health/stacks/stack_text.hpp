// Text helpers that stacks.cpp (reading the tools' output) and stack_merge.cpp (writing the
// store's compact JSON) share: a string field of a JSON object, and a cut that never splits a
// UTF-8 sequence.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace ddp::launch::stack_text {

// j[key] when it is a string, else "".
inline std::string json_string(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Cut at `n` bytes, never inside a UTF-8 sequence.
inline std::string clip(const std::string& s, std::size_t n) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

}  // namespace ddp::launch::stack_text
