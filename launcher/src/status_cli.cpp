// `ddprun status` (status_cli.hpp). STUB: owned by a helper.
#include "ddp/launch/status_cli.hpp"

namespace ddp::launch {

int run_status_command(const std::vector<std::string>&) { return 2; }
std::string format_status_table(const status::JobStatus&) { return ""; }

}  // namespace ddp::launch
