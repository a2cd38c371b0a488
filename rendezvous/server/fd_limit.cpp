// Lifts the soft descriptor limit to the hard one (used by ddprund and the load generator).
#include "ddp/rdzv/fd_limit.hpp"

#include <sys/resource.h>

namespace ddp::rdzv {

std::uint64_t raise_fd_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur;
}

}  // namespace ddp::rdzv
