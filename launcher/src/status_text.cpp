// The progress line and the exit summary (status_text.hpp). STUB: owned by a helper.
#include "ddp/launch/status_text.hpp"

namespace ddp::launch {

std::string format_progress_line(const status::NodeStatus&) { return ""; }
std::string format_exit_summary(const status::JobStatus&, double, int) { return ""; }

}  // namespace ddp::launch
