// Incremental, allocation-light decoder for TCPStore requests (torch 2.x, torch 1.13 and the
// ddprun extensions). Pure: bytes in, one Request out, no I/O. Lengths are checked against
// Limits before anything is kept, so a hostile length prefix costs nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/proto/opcodes.hpp"

namespace ddp::proto {

// One decoded request. Views point into the buffer given to Decoder::decode and stay valid
// until that buffer changes. Reused between calls so the vectors keep their capacity.
struct Request {
  Op op = Op::validate;
  std::vector<std::string_view> keys;  // single-key ops use keys[0]
  std::vector<std::string_view>
      values;             // SET/APPEND/QUEUE_PUSH: [0]; COMPARE_SET: expected, desired
  std::int64_t i64 = 0;   // ADD delta, BARRIER world size, LEASE_GRANT ttl_ms
  std::uint64_t u64 = 0;  // lease id
  std::uint32_t u32 = 0;  // VALIDATE magic, PING nonce, HELLO version
  std::uint8_t u8 = 0;    // LEASE_GRANT bind_to_connection

  void clear() {
    keys.clear();
    values.clear();
    i64 = 0;
    u64 = 0;
    u32 = 0;
    u8 = 0;
  }
};

enum class DecodeStatus : std::uint8_t { ok, need_more, error };

struct DecodeResult {
  DecodeStatus status = DecodeStatus::need_more;
  std::size_t consumed = 0;  // bytes of the request when ok
  std::string error;         // what was wrong when error
};

class Decoder {
 public:
  explicit Decoder(Limits limits = {}) : limits_(limits) {}

  // Decodes one request from the front of `data`. The first call decides the dialect.
  DecodeResult decode(std::span<const char> data, Request& out);

  Dialect dialect() const { return dialect_; }
  const Limits& limits() const { return limits_; }

 private:
  Limits limits_;
  Dialect dialect_ = Dialect::unknown;
};

}  // namespace ddp::proto
