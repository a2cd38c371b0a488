// safe_substitute (macros.hpp): Python's string.Template with its default pattern: identifiers
// [_a-zA-Z][_a-zA-Z0-9]*, "$$" an escaped "$", unknown or malformed placeholders kept.
#include "ddp/launch/macros.hpp"

#include <cctype>

namespace ddp::launch {

namespace {
bool id_start(char c) { return c == '_' || std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool id_char(char c) { return c == '_' || std::isalnum(static_cast<unsigned char>(c)) != 0; }
}  // namespace

std::string safe_substitute(std::string_view text, const std::map<std::string, std::string>& vars,
                            bool escape) {
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    if (text[i] != '$' || i + 1 >= text.size()) {
      out.push_back(text[i++]);
      continue;
    }
    const char next = text[i + 1];
    if (next == '$') {  // "$$": one literal '$' (or kept whole)
      out.append(escape ? "$" : "$$");
      i += 2;
      continue;
    }
    std::size_t begin = i + 1, end = begin;
    const bool braced = next == '{';
    if (braced) ++begin;
    end = begin;
    if (end < text.size() && id_start(text[end])) {
      while (end < text.size() && id_char(text[end])) ++end;
    }
    const bool closed = !braced || (end < text.size() && text[end] == '}');
    if (end == begin || !closed) {  // not a placeholder: keep the '$'
      out.push_back(text[i++]);
      continue;
    }
    auto it = vars.find(std::string(text.substr(begin, end - begin)));
    const std::size_t after = braced ? end + 1 : end;
    if (it == vars.end()) {
      out.append(text.substr(i, after - i));  // unknown: left as written
    } else {
      out += it->second;
    }
    i = after;
  }
  return out;
}

}  // namespace ddp::launch
