// Maps each decoded request to KvTable calls and encodes the reply exactly as torch's
// servers do (torch-compat.md §5.4): i64 for counts, u64-length bytes for values, u8 enums.
#include "dispatch.hpp"

#include <algorithm>

#include "ddp/proto/error.hpp"
#include "ddp/proto/writer.hpp"

namespace ddp::rdzv {

using proto::Op;

namespace {
constexpr std::int64_t kMaxLeaseTtlMs = 30LL * 24 * 3600 * 1000;

// A reply of `size` bytes must fit the room the connection has left.
bool reply_fits(DispatchContext& ctx, proto::Op op, std::size_t size) {
  if (size <= ctx.max_reply) return true;
  ctx.error = "the reply to " + std::string(proto::op_name(op)) + " would be " +
              std::to_string(size) + " bytes, over the " + std::to_string(ctx.max_reply) +
              " left in this connection's memory budget (ddprund --max-connection-bytes)";
  ctx.over_budget = true;
  return false;
}
}  // namespace

Outcome dispatch(const proto::Request& req, DispatchContext& ctx) {
  proto::Writer w(ctx.out);
  auto reply = [&]() -> proto::Writer& {
    if (ctx.status_prefix) w.u8(proto::kReplyOk);
    return w;
  };
  auto& t = ctx.table;
  try {
    switch (req.op) {
      case Op::validate: return Outcome::replied;
      case Op::hello: {
        const auto version = std::min(req.u32, proto::kExtensionVersion);
        reply().value<std::uint32_t>(version);
        if (version >= 2) w.bytes(ctx.nonce);
        return Outcome::replied;
      }
      case Op::ping: reply().value<std::uint32_t>(req.u32); return Outcome::replied;
      case Op::set: t.set(req.keys[0], req.values[0], ctx.woken); return Outcome::replied;
      case Op::compare_set:
        reply().bytes(t.compare_set(req.keys[0], req.values[0], req.values[1], ctx.woken));
        return Outcome::replied;
      case Op::get: {
        // torch clients WAIT first; a key deleted in between reads as empty (libuv server).
        const std::string* v = t.get(req.keys[0]);
        reply().bytes(v ? std::string_view(*v) : std::string_view());
        return Outcome::replied;
      }
      case Op::add:
        reply().value<std::int64_t>(t.add(req.keys[0], req.i64, ctx.woken));
        return Outcome::replied;
      case Op::check: {
        bool all = true;
        for (auto k : req.keys) all = all && t.exists(k);
        reply().u8(all ? proto::kCheckReady : proto::kCheckNotReady);
        return Outcome::replied;
      }
      case Op::wait:
        if (t.wait(ctx.self, req.keys)) {
          reply().u8(proto::kStopWaiting);
          return Outcome::replied;
        }
        return Outcome::waiting;
      case Op::num_keys:
        reply().value<std::int64_t>(static_cast<std::int64_t>(t.num_keys()));
        return Outcome::replied;
      case Op::delete_key:
        reply().value<std::int64_t>(t.erase(req.keys[0]) ? 1 : 0);
        return Outcome::replied;
      case Op::append: t.append(req.keys[0], req.values[0], ctx.woken); return Outcome::replied;
      case Op::multi_get: {
        std::size_t size = 1;
        for (auto k : req.keys) {
          const std::string* v = t.get(k);
          size += 8 + (v ? v->size() : 0);
        }
        if (!reply_fits(ctx, req.op, size)) return Outcome::failed;
        reply();
        for (auto k : req.keys) {
          const std::string* v = t.get(k);
          w.bytes(v ? std::string_view(*v) : std::string_view());
        }
        return Outcome::replied;
      }
      case Op::multi_set:
        for (std::size_t i = 0; i < req.keys.size(); ++i) {
          t.set(req.keys[i], req.values[i], ctx.woken);
        }
        return Outcome::replied;
      case Op::queue_push:
        t.queue_push(req.keys[0], req.values[0], ctx.woken);
        return Outcome::replied;
      case Op::queue_pop: {
        std::string v;
        std::int64_t len = t.queue_pop(req.keys[0], v);
        reply().value<std::int64_t>(len);
        if (len > 0) w.bytes(v);
        return Outcome::replied;
      }
      case Op::queue_len:
        reply().value<std::int64_t>(t.queue_len(req.keys[0]));
        return Outcome::replied;
      case Op::list_keys: {
        auto keys = t.list_keys();
        std::size_t size = 9;
        for (auto k : keys) size += 8 + k.size();
        if (!reply_fits(ctx, req.op, size)) return Outcome::failed;
        reply().value<std::int64_t>(static_cast<std::int64_t>(keys.size()));
        for (auto k : keys) w.bytes(k);
        return Outcome::replied;
      }
      case Op::barrier:
        if (req.i64 <= 0) {
          ctx.error = "BARRIER with world size " + std::to_string(req.i64) + " (must be > 0)";
          return Outcome::failed;
        }
        if (t.barrier(ctx.self, req.keys[0], req.i64, ctx.woken)) {
          reply().u8(proto::kStopWaiting);
          return Outcome::replied;
        }
        return Outcome::waiting;
      case Op::lease_grant:
        if (req.i64 == 0 && req.u8 == 0) {
          ctx.error = "LEASE_GRANT needs a ttl or bind_to_connection";
          return Outcome::failed;
        }
        if (req.i64 > kMaxLeaseTtlMs) {
          ctx.error = "LEASE_GRANT ttl of " + std::to_string(req.i64) +
                      " ms exceeds the maximum of 30 days";
          return Outcome::failed;
        }
        reply().value<std::uint64_t>(t.lease_grant(Millis(req.i64), req.u8 != 0 ? ctx.self : 0,
                                                   ctx.now, ctx.self, ctx.max_leases));
        return Outcome::replied;
      case Op::lease_keepalive:
        reply().u8(t.lease_keepalive(req.u64, ctx.now, ctx.self) ? 0 : 1);
        return Outcome::replied;
      case Op::lease_revoke: reply().u8(t.lease_revoke(req.u64) ? 0 : 1); return Outcome::replied;
      case Op::set_with_lease:
        reply().u8(t.set_with_lease(req.keys[0], req.values[0], req.u64, ctx.woken) ? 0 : 1);
        return Outcome::replied;
      case Op::lease_will:
        reply().u8(t.lease_will(req.u64, req.keys[0], req.values[0]) ? 0 : 1);
        return Outcome::replied;
      case Op::cancel_wait:
      case Op::auth:  // the connection's gate answers it (gate.hpp)
      case Op::watch_key: break;
    }
  } catch (const ProtocolError& e) {
    ctx.error = e.what();
    return Outcome::failed;
  }
  ctx.error = std::string(proto::op_name(req.op)) + " is not handled here";
  return Outcome::failed;
}

}  // namespace ddp::rdzv
