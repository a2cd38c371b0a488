// Prometheus text for the status records and the store's counters (metrics.hpp). STUB: owned by
// a helper.
#include "ddp/status/metrics.hpp"

namespace ddp::status {

std::string render_metrics(const std::vector<JobStatus>&, const std::optional<rdzv::ServerStats>&) {
  return "";
}

}  // namespace ddp::status
