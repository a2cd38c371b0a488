// The TCPStore wire contract: opcodes of both torch dialects, ddprun's extension opcodes, and
// the limits every decoder enforces. No sockets, no threads. torch-compat.md §5 is the source.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace ddp::proto {

// The magic a torch >= 2.2 client sends after opcode 0 (VALIDATE), little-endian on the wire.
inline constexpr std::uint32_t kValidateMagic = 0x3C85F7CE;

// What a connection speaks. Decided by its first bytes (see Decoder).
enum class Dialect : std::uint8_t {
  unknown,  // nothing read yet
  v2,       // torch >= 2.2: VALIDATE first, opcodes of current main (plus ddprun's extensions)
  v1_13,    // torch <= 2.0: no handshake, SET = 0 ... DELETE_KEY = 8
};

// Dialect-independent operations. The numeric values are the torch 2.x opcodes; the
// extensions live at 0x80 and above, where no torch version has ever put an opcode.
enum class Op : std::uint8_t {
  validate = 0,
  set = 1,
  compare_set = 2,
  get = 3,
  add = 4,
  check = 5,
  wait = 6,
  num_keys = 7,
  delete_key = 8,
  append = 9,
  multi_get = 10,
  multi_set = 11,
  cancel_wait = 12,
  ping = 13,
  queue_push = 14,
  queue_pop = 15,
  queue_len = 16,
  list_keys = 17,
  barrier = 18,
  // ddprun extensions (docs/wire_protocol.md). torch clients never send these.
  // u32 version -> u32 version (the lower of both), then, from version 2, bytes nonce: the
  // server's challenge for AUTH, empty when the server has no secret. Status-prefixed replies
  // from here on.
  hello = 0x80,
  lease_grant = 0x81,      // i64 ttl_ms, u8 bind_to_connection -> u64 lease id
  lease_keepalive = 0x82,  // u64 lease -> u8 0 ok / 1 unknown or expired
  lease_revoke = 0x83,     // u64 lease -> u8 0 ok / 1 unknown; deletes the lease's keys
  set_with_lease = 0x84,   // str key, bytes value, u64 lease -> u8 0 ok / 1 unknown lease
  // u64 lease, str key, bytes value -> u8 0 ok / 1 unknown lease. The lease's will: when the
  // lease expires or its connection closes (not on LEASE_REVOKE), the server sets key to value
  // if key is absent, waking its waiters. An empty key clears the will.
  lease_will = 0x85,
  // bytes client nonce, bytes proof -> bytes server proof (empty: the server has no secret).
  // The proof answers the nonce of the HELLO reply (version >= 2): proto/auth.hpp. A wrong
  // proof gets kReplyError and the connection closes.
  auth = 0x86,
  watch_key = 0xFE,  // torch 1.13 only (opcode 7 there); refused
};

inline constexpr std::uint8_t kCheckReady = 0;
inline constexpr std::uint8_t kCheckNotReady = 1;
inline constexpr std::uint8_t kStopWaiting = 0;
inline constexpr std::uint8_t kWaitCanceled = 1;

// Status byte that prefixes every reply on a connection that sent HELLO.
inline constexpr std::uint8_t kReplyOk = 0;
inline constexpr std::uint8_t kReplyError = 1;  // followed by str message; connection then closes

inline constexpr std::uint32_t kExtensionVersion = 2;  // 2: HELLO carries the AUTH nonce

// Maps a wire byte to an operation for the given dialect; nullopt for an unknown opcode.
std::optional<Op> op_from_wire(Dialect dialect, std::uint8_t byte);
// The byte a client of `dialect` sends for `op` (used by clients and tests).
std::uint8_t op_to_wire(Dialect dialect, Op op);
std::string_view op_name(Op op);

// Limits enforced while decoding, before anything is allocated. Defaults are torch's libuv
// server's (MAX_STRING_LEN, MAX_PAYLOAD_LEN, MAX_KEY_COUNT).
struct Limits {
  std::size_t max_key_bytes = 8 * 1024;
  std::size_t max_value_bytes = 8 * 1024 * 1024;
  std::size_t max_keys_per_request = 128 * 1024;
  std::size_t max_request_bytes = 64 * 1024 * 1024;  // one whole request, MULTI_SET included
};

}  // namespace ddp::proto
