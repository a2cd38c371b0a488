// One request against the KvTable: decides the reply bytes, registers waits, reports woken
// waiters. Pure (no sockets, no locks), so every opcode is unit-tested byte for byte.
#pragma once

#include <cstdint>
#include <string>

#include "ddp/proto/decoder.hpp"
#include "ddp/rdzv/kv_table.hpp"

namespace ddp::rdzv {

enum class Outcome : std::uint8_t {
  replied,  // reply (possibly none, for SET-like ops) is in `out`
  waiting,  // WAIT/BARRIER registered; STOP_WAITING comes when woken
  failed,   // request refused: `error` says why, the connection must close
};

struct DispatchContext {
  KvTable& table;
  WaiterId self;
  Millis now;
  bool status_prefix;  // the connection sent HELLO: every reply starts with kReplyOk
  std::string& out;
  Woken& woken;
  std::string error;
  // Room left in the connection's memory budget: a MULTI_GET or LIST_KEYS whose reply would
  // not fit is refused before it is built (with over_budget set).
  std::size_t max_reply = SIZE_MAX;
  std::size_t max_leases = 0;  // live leases one connection may hold; 0: no limit
  // HELLO from version 2: the AUTH challenge its reply carries (empty: no secret).
  std::string_view nonce = {};
  bool over_budget = false;
};

// Not for CANCEL_WAIT, which needs the connection's wake bookkeeping (session.cpp).
Outcome dispatch(const proto::Request& req, DispatchContext& ctx);

}  // namespace ddp::rdzv
