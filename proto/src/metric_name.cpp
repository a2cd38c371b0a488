// See metric_name.hpp.
#include "ddp/proto/metric_name.hpp"

namespace ddp {

bool metric_name_ok(std::string_view name) {
  if (name.empty() || name.size() > kMaxMetricName) return false;
  const char first = name.front();
  if (!((first >= 'a' && first <= 'z') || (first >= 'A' && first <= 'Z') || first == '_')) {
    return false;
  }
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool is_throughput_metric(std::string_view name) {
  constexpr std::string_view kSuffix = "_per_s";
  return name.size() > kSuffix.size() && name.substr(name.size() - kSuffix.size()) == kSuffix;
}

}  // namespace ddp
