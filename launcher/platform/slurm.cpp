// Slurm host-list and count expansion (see slurm.hpp).
#include "ddp/launch/slurm.hpp"

#include <charconv>

#include "ddp/proto/error.hpp"

namespace ddp::launch {
namespace {

[[noreturn]] void bad(std::string_view list, const std::string& why) {
  throw ConfigError(std::string("Slurm list '").append(list).append("': ").append(why));
}

// Splits at commas outside brackets.
std::vector<std::string_view> split_top(std::string_view list) {
  std::vector<std::string_view> out;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '[') ++depth;
    if (list[i] == ']') --depth;
    if (depth < 0 || depth > 1) bad(list, "unbalanced or nested brackets");
    if (list[i] == ',' && depth == 0) {
      out.push_back(list.substr(start, i - start));
      start = i + 1;
    }
  }
  if (depth != 0) bad(list, "a '[' is never closed");
  out.push_back(list.substr(start));
  return out;
}

unsigned long long number(std::string_view list, std::string_view text) {
  unsigned long long v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    bad(list, std::string("'").append(text).append("' is not a number"));
  }
  return v;
}

// "01-04,7" -> {"01","02","03","04","7"}, keeping the start's zero padding.
std::vector<std::string> expand_ranges(std::string_view list, std::string_view ranges,
                                       std::size_t limit) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= ranges.size()) {
    std::size_t comma = ranges.find(',', start);
    if (comma == std::string_view::npos) comma = ranges.size();
    const std::string_view item = ranges.substr(start, comma - start);
    const std::size_t dash = item.find('-');
    const std::string_view lo_text = item.substr(0, dash);
    const std::string_view hi_text =
        dash == std::string_view::npos ? lo_text : item.substr(dash + 1);
    const auto lo = number(list, lo_text);
    const auto hi = number(list, hi_text);
    if (hi < lo) bad(list, std::string("the range '").append(item).append("' runs backwards"));
    if (hi - lo >= limit || out.size() + (hi - lo) >= limit) {
      bad(list, std::string("more than ").append(std::to_string(limit)).append(" hosts"));
    }
    for (auto v = lo; v <= hi; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < lo_text.size()) {
        digits.insert(0, lo_text.size() - digits.size(), '0');
      }
      out.push_back(std::move(digits));
    }
    start = comma + 1;
  }
  return out;
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list, std::size_t limit) {
  std::vector<std::string> hosts;
  if (list.empty()) bad(list, "empty");
  for (std::string_view item : split_top(list)) {
    if (item.empty()) bad(list, "an empty host between commas");
    // The item as literal pieces and bracket groups; the product of every group's values.
    std::vector<std::string> partial = {""};
    std::size_t at = 0;
    while (at < item.size()) {
      const std::size_t open = item.find('[', at);
      const std::string_view literal = item.substr(at, open - at);
      for (auto& p : partial) p.append(literal);
      if (open == std::string_view::npos) break;
      const std::size_t close = item.find(']', open);
      const auto values = expand_ranges(list, item.substr(open + 1, close - open - 1), limit);
      if (partial.size() * values.size() > limit) {
        bad(list, std::string("more than ").append(std::to_string(limit)).append(" hosts"));
      }
      std::vector<std::string> next;
      next.reserve(partial.size() * values.size());
      for (const auto& p : partial) {
        for (const auto& v : values) next.push_back(p + v);
      }
      partial = std::move(next);
      at = close + 1;
    }
    for (auto& p : partial) {
      if (hosts.size() >= limit)
        bad(list, std::string("more than ").append(std::to_string(limit)).append(" hosts"));
      hosts.push_back(std::move(p));
    }
  }
  return hosts;
}

std::vector<int> expand_counts(std::string_view list) {
  std::vector<int> out;
  if (list.empty()) bad(list, "empty");
  for (std::string_view item : split_top(list)) {
    const std::size_t paren = item.find('(');
    const auto count = number(list, item.substr(0, paren));
    unsigned long long repeat = 1;
    if (paren != std::string_view::npos) {
      if (item.size() < paren + 4 || item.substr(paren, 2) != "(x" || item.back() != ')') {
        bad(list, std::string("'").append(item).append("' is not N or N(xR)"));
      }
      repeat = number(list, item.substr(paren + 2, item.size() - paren - 3));
    }
    if (count > 1 << 20 || repeat > 1 << 20 || out.size() + repeat > (1 << 20)) {
      bad(list, "counts too large");
    }
    out.insert(out.end(), static_cast<std::size_t>(repeat), static_cast<int>(count));
  }
  return out;
}

}  // namespace ddp::launch
