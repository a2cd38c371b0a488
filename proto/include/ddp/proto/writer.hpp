// Appends TCPStore primitives to a byte buffer: the one encoder used by the server for
// replies and by clients and the load generator for requests. Little-endian, like torch.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "ddp/proto/opcodes.hpp"

namespace ddp::proto {

class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}

  template <typename T>
  requires std::is_integral_v<T> Writer& value(T v) {
    char raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    out_.append(raw, sizeof(T));
    return *this;
  }
  Writer& u8(std::uint8_t v) {
    out_.push_back(static_cast<char>(v));
    return *this;
  }
  // u64 length + bytes: torch's appendString/appendBytes and sendVector.
  Writer& bytes(std::string_view b) {
    value<std::uint64_t>(b.size());
    out_.append(b);
    return *this;
  }
  Writer& op(Dialect d, Op o) { return u8(op_to_wire(d, o)); }

 private:
  std::string& out_;
};

}  // namespace ddp::proto
