// A choice's names in one table (enum value <-> the word a user types), and the lookups every
// option parser of ddp-train uses: name_of, find (no throw) and parse (ConfigError naming the
// flag).
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/proto/error.hpp"

namespace ddp::train::choice_names {

template <typename E>
struct Name {
  E value;
  const char* text;
};

template <typename E, std::size_t N>
std::string name_of(const Name<E> (&table)[N], E value) {
  for (const auto& n : table) {
    if (n.value == value) return n.text;
  }
  return "?";
}

template <typename E, std::size_t N>
std::optional<E> find(const Name<E> (&table)[N], std::string_view text) {
  for (const auto& n : table) {
    if (text == n.text) return n.value;
  }
  return std::nullopt;
}

// "--flag 'word': expected <choices>" unless the word names a choice.
template <typename E, std::size_t N>
E parse(const Name<E> (&table)[N], std::string_view word, const char* flag, const char* choices) {
  if (auto v = find(table, word)) return *v;
  throw ConfigError(std::string(flag) + " '" + std::string(word) + "': expected " + choices);
}

}  // namespace ddp::train::choice_names
