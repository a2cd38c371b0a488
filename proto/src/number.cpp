// The one number parser (number.hpp): std::from_chars on the whole text, then the range.
#include "ddp/proto/number.hpp"

#include <charconv>
#include <cmath>
#include <string>

#include "ddp/proto/error.hpp"

namespace ddp {

namespace {
std::string range(double lo, double hi) {
  auto f = [](double v) {
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s;
  };
  return "[" + f(lo) + ", " + f(hi) + "]";
}
}  // namespace

std::int64_t parse_int(std::string_view text, std::string_view what, std::int64_t min,
                       std::int64_t max) {
  std::int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  const std::string head = std::string(what) + " '" + std::string(text) + "' is ";
  if (text.empty() || end != text.data() + text.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    throw ConfigError(head + "not an integer");
  }
  if (ec == std::errc::result_out_of_range || v < min || v > max) {
    throw ConfigError(head + "out of range [" + std::to_string(min) + ", " + std::to_string(max) +
                      "]");
  }
  return v;
}

std::chrono::milliseconds parse_seconds(std::string_view text, std::string_view what, double min_s,
                                        double max_s) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) ||
      v < min_s || v > max_s) {
    throw ConfigError(std::string(what) + " '" + std::string(text) +
                      "' is not a number of seconds in " + range(min_s, max_s));
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(v * 1000)));
}

}  // namespace ddp
