// TCPStore request decoder: little-endian integers, u64-length-prefixed strings, one opcode
// byte per request, no frame header (torch-compat.md §5.1). Every length is checked against
// Limits as soon as it is read, before the body is waited for.
#include "ddp/proto/decoder.hpp"

#include <cstring>

#include "ddp/proto/auth.hpp"

namespace ddp::proto {
namespace {

// Reads primitives from a byte span; remembers whether it ran out or hit a limit.
class Cursor {
 public:
  explicit Cursor(std::span<const char> data) : data_(data) {}

  template <typename T>
  bool read(T& out) {
    if (!ok()) return false;
    if (data_.size() - pos_ < sizeof(T)) {
      short_ = true;
      return false;
    }
    std::memcpy(&out, data_.data() + pos_, sizeof(T));  // wire is little-endian, as is the host
    pos_ += sizeof(T);
    return true;
  }

  bool bytes(std::string_view& out, std::size_t limit, const char* what) {
    std::uint64_t len = 0;
    if (!read(len)) return false;
    if (len > limit) {
      fail(std::string(what) + " of " + std::to_string(len) + " bytes exceeds the limit of " +
           std::to_string(limit));
      return false;
    }
    if (data_.size() - pos_ < len) {
      short_ = true;
      return false;
    }
    out = std::string_view(data_.data() + pos_, static_cast<std::size_t>(len));
    pos_ += static_cast<std::size_t>(len);
    return true;
  }

  bool count(std::uint64_t& out, std::size_t limit) {
    if (!read(out)) return false;
    if (out > limit) {
      fail("request names " + std::to_string(out) + " keys, more than the limit of " +
           std::to_string(limit));
      return false;
    }
    return true;
  }

  void fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
  }
  bool ok() const { return !short_ && error_.empty(); }
  bool is_short() const { return short_; }
  const std::string& error() const { return error_; }
  std::size_t pos() const { return pos_; }

 private:
  std::span<const char> data_;
  std::size_t pos_ = 0;
  bool short_ = false;
  std::string error_;
};

// Decides the dialect from the first bytes: "00 CE F7 85 3C" is a torch >= 2.2 VALIDATE;
// an extension opcode means a ddprun client; 0..8 otherwise is a torch 1.13 request.
DecodeResult detect(std::span<const char> data, Dialect& dialect) {
  auto first = static_cast<std::uint8_t>(data[0]);
  if (first == 0) {
    if (data.size() < 5) return {DecodeStatus::need_more, 0, {}};
    std::uint32_t magic = 0;
    std::memcpy(&magic, data.data() + 1, sizeof(magic));
    dialect = magic == kValidateMagic ? Dialect::v2 : Dialect::v1_13;
  } else if (first >= static_cast<std::uint8_t>(Op::hello)) {
    dialect = Dialect::v2;
  } else if (first <= 8) {
    dialect = Dialect::v1_13;
  } else {
    return {DecodeStatus::error, 0,
            "first byte " + std::to_string(first) +
                " is neither a torch 2.x VALIDATE nor a torch 1.13 request"};
  }
  return {DecodeStatus::ok, 0, {}};
}

void parse_body(Op op, Cursor& c, Request& r, const Limits& lim) {
  std::string_view s;
  std::uint64_t n = 0;
  switch (op) {
    case Op::validate:
      c.read(r.u32);
      if (c.ok() && r.u32 != kValidateMagic) c.fail("VALIDATE with a wrong magic number");
      break;
    case Op::set:
    case Op::append:
    case Op::queue_push:
      if (c.bytes(s, lim.max_key_bytes, "key")) r.keys.push_back(s);
      if (c.bytes(s, lim.max_value_bytes, "value")) r.values.push_back(s);
      break;
    case Op::compare_set:
      if (c.bytes(s, lim.max_key_bytes, "key")) r.keys.push_back(s);
      if (c.bytes(s, lim.max_value_bytes, "expected value")) r.values.push_back(s);
      if (c.bytes(s, lim.max_value_bytes, "desired value")) r.values.push_back(s);
      break;
    case Op::get:
    case Op::delete_key:
    case Op::queue_pop:
    case Op::queue_len:
      if (c.bytes(s, lim.max_key_bytes, "key")) r.keys.push_back(s);
      break;
    case Op::add:
    case Op::barrier:
      if (c.bytes(s, lim.max_key_bytes, "key")) r.keys.push_back(s);
      c.read(r.i64);
      break;
    case Op::check:
    case Op::wait:
    case Op::multi_get:
      if (!c.count(n, lim.max_keys_per_request)) break;
      for (std::uint64_t i = 0; i < n && c.bytes(s, lim.max_key_bytes, "key"); ++i) {
        r.keys.push_back(s);
      }
      break;
    case Op::multi_set: {
      std::int64_t signed_n = 0;
      if (!c.read(signed_n)) break;
      if (signed_n < 0) {
        c.fail("MULTI_SET with a negative key count");
        break;
      }
      n = static_cast<std::uint64_t>(signed_n);
      if (n > lim.max_keys_per_request) {
        c.fail("request names " + std::to_string(n) + " keys, more than the limit of " +
               std::to_string(lim.max_keys_per_request));
        break;
      }
      for (std::uint64_t i = 0; i < n && c.ok(); ++i) {
        if (c.bytes(s, lim.max_key_bytes, "key")) r.keys.push_back(s);
        if (c.bytes(s, lim.max_value_bytes, "value")) r.values.push_back(s);
      }
      break;
    }
    case Op::num_keys:
    case Op::cancel_wait:
    case Op::list_keys: break;
    case Op::ping:
    case Op::hello: c.read(r.u32); break;
    case Op::lease_grant:
      c.read(r.i64);
      c.read(r.u8);
      if (c.ok() && r.i64 < 0) c.fail("LEASE_GRANT with a negative ttl");
      break;
    case Op::lease_keepalive:
    case Op::lease_revoke: c.read(r.u64); break;
    case Op::set_with_lease:
      if (c.bytes(s, lim.max_key_bytes, "key")) r.keys.push_back(s);
      if (c.bytes(s, lim.max_value_bytes, "value")) r.values.push_back(s);
      c.read(r.u64);
      break;
    case Op::lease_will:
      c.read(r.u64);
      if (c.bytes(s, lim.max_key_bytes, "key")) r.keys.push_back(s);
      if (c.bytes(s, lim.max_value_bytes, "value")) r.values.push_back(s);
      break;
    case Op::auth:
      if (c.bytes(s, 2 * auth::kNonceBytes, "client nonce")) r.keys.push_back(s);
      if (c.bytes(s, 2 * auth::kProofBytes, "proof")) r.values.push_back(s);
      break;
    case Op::watch_key: c.fail("WATCH_KEY (torch 1.13 watchKey) is not supported"); break;
  }
}

}  // namespace

DecodeResult Decoder::decode(std::span<const char> data, Request& out) {
  if (data.empty()) return {DecodeStatus::need_more, 0, {}};
  if (dialect_ == Dialect::unknown) {
    auto d = detect(data, dialect_);
    if (d.status != DecodeStatus::ok) return d;
  }
  auto byte = static_cast<std::uint8_t>(data[0]);
  auto op = op_from_wire(dialect_, byte);
  if (!op) {
    return {DecodeStatus::error, 0,
            "unknown opcode " + std::to_string(byte) + " for a " +
                (dialect_ == Dialect::v1_13 ? "torch 1.13" : "torch 2.x") + " client"};
  }
  out.clear();
  out.op = *op;
  Cursor c(data.subspan(1));
  parse_body(*op, c, out, limits_);
  if (!c.error().empty()) {
    return {DecodeStatus::error, 0, std::string(op_name(*op)) + ": " + c.error()};
  }
  if (c.is_short()) {
    // Everything buffered belongs to this one unfinished request.
    if (data.size() > limits_.max_request_bytes) {
      return {DecodeStatus::error, 0,
              std::string(op_name(*op)) + ": request exceeds the limit of " +
                  std::to_string(limits_.max_request_bytes) + " bytes"};
    }
    return {DecodeStatus::need_more, 0, {}};
  }
  return {DecodeStatus::ok, 1 + c.pos(), {}};
}

}  // namespace ddp::proto
