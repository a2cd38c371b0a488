// The agent's status record, its publishing thread and its views (status_reporter.hpp).
#include "ddp/launch/status_reporter.hpp"

namespace ddp::launch {
}  // namespace ddp::launch
