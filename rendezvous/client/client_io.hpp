// What the client's two files (client.cpp: requests; dialer.cpp: connecting) share: the clock,
// the wire names, and the milliseconds left before a deadline, for poll().
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "ddp/proto/opcodes.hpp"
#include "ddp/proto/writer.hpp"

namespace ddp::rdzv {

using Clock = std::chrono::steady_clock;
using proto::Dialect;
using proto::Op;
using proto::Writer;

inline int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<std::int64_t>(0, left.count()));
}

}  // namespace ddp::rdzv
