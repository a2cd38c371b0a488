// Connection storms need one descriptor per client: raise_fd_limit() lifts this process's
// soft RLIMIT_NOFILE to the hard limit and returns the limit now in force.
#pragma once

#include <cstdint>

namespace ddp::rdzv {

std::uint64_t raise_fd_limit();

}  // namespace ddp::rdzv
