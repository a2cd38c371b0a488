// Opcode tables of both torch dialects (torch-compat.md §5.2) and readable names for logs.
#include "ddp/proto/opcodes.hpp"

#include <array>

namespace ddp::proto {
namespace {

// torch <= 2.0 (1.13): SET=0, COMPARE_SET=1, GET=2, ADD=3, CHECK=4, WAIT=5, GETNUMKEYS=6,
// WATCH_KEY=7, DELETE_KEY=8.
constexpr std::array<Op, 9> kV113 = {Op::set,      Op::compare_set, Op::get,
                                     Op::add,      Op::check,       Op::wait,
                                     Op::num_keys, Op::watch_key,   Op::delete_key};

bool is_extension(std::uint8_t byte) {
  return byte >= static_cast<std::uint8_t>(Op::hello) &&
         byte <= static_cast<std::uint8_t>(Op::auth);
}

}  // namespace

std::optional<Op> op_from_wire(Dialect dialect, std::uint8_t byte) {
  if (dialect == Dialect::v1_13) {
    if (byte < kV113.size()) return kV113[byte];
    return std::nullopt;
  }
  if (byte <= static_cast<std::uint8_t>(Op::barrier) || is_extension(byte)) {
    return static_cast<Op>(byte);
  }
  return std::nullopt;
}

std::uint8_t op_to_wire(Dialect dialect, Op op) {
  if (dialect == Dialect::v1_13) {
    for (std::size_t i = 0; i < kV113.size(); ++i) {
      if (kV113[i] == op) return static_cast<std::uint8_t>(i);
    }
    return 0xFF;  // no such opcode in 1.13
  }
  return static_cast<std::uint8_t>(op);
}

std::string_view op_name(Op op) {
  switch (op) {
    case Op::validate: return "VALIDATE";
    case Op::set: return "SET";
    case Op::compare_set: return "COMPARE_SET";
    case Op::get: return "GET";
    case Op::add: return "ADD";
    case Op::check: return "CHECK";
    case Op::wait: return "WAIT";
    case Op::num_keys: return "GETNUMKEYS";
    case Op::delete_key: return "DELETE_KEY";
    case Op::append: return "APPEND";
    case Op::multi_get: return "MULTI_GET";
    case Op::multi_set: return "MULTI_SET";
    case Op::cancel_wait: return "CANCEL_WAIT";
    case Op::ping: return "PING";
    case Op::queue_push: return "QUEUE_PUSH";
    case Op::queue_pop: return "QUEUE_POP";
    case Op::queue_len: return "QUEUE_LEN";
    case Op::list_keys: return "LIST_KEYS";
    case Op::barrier: return "BARRIER";
    case Op::hello: return "HELLO";
    case Op::lease_grant: return "LEASE_GRANT";
    case Op::lease_keepalive: return "LEASE_KEEPALIVE";
    case Op::lease_revoke: return "LEASE_REVOKE";
    case Op::set_with_lease: return "SET_WITH_LEASE";
    case Op::lease_will: return "LEASE_WILL";
    case Op::auth: return "AUTH";
    case Op::watch_key: return "WATCH_KEY";
  }
  return "?";
}

}  // namespace ddp::proto
