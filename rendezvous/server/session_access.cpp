// Session's access checks (docs/security.md): the gate in front of dispatch, and the closing
// of a refused connection, counted and logged by SharedState::audit (rate-limited) rather than
// by fail(), so that a storm of bad clients cannot flood the log.
#include "ddp/proto/auth.hpp"
#include "ddp/proto/writer.hpp"
#include "session.hpp"

namespace ddp::rdzv {

using proto::Op;

// Access first: a connection that must authenticate may only VALIDATE, HELLO, PING and AUTH
// (answered here). True when the request goes on to dispatch.
bool Session::gate(const proto::Request& req) {
  Refusal why = Refusal::none;
  if (plain_refused_ && req.op != Op::validate && req.op != Op::hello) {
    refuse(Refusal::plain);
    return false;
  }
  if (!gate_.allows(req.op, why)) {
    refuse(why);
    return false;
  }
  if (req.op == Op::auth) {
    why = gate_.authenticate(req, out_);
    if (why != Refusal::none) {
      refuse(why);
      return false;
    }
    shared_.auth_ok.fetch_add(1, std::memory_order_relaxed);
    account();
    return false;
  }
  if (req.op == Op::hello && gate_.wants_nonce(req.u32)) gate_.set_nonce(proto::auth::nonce());
  return true;
}

void Session::refuse(Refusal why) {
  shared_.audit(why, peer());
  if (status_prefix_) {
    proto::Writer(out_)
        .u8(proto::kReplyError)
        .bytes(why == Refusal::plain
                   ? "this store takes only TLS from other hosts (DDPRUN_STORE_TLS_ONLY=1): set "
                     "DDPRUN_STORE_TLS_CERT, DDPRUN_STORE_TLS_KEY and DDPRUN_STORE_TLS_CA"
               : why == Refusal::unauthenticated
                   ? "authentication required: this store admits only the job's processes; give "
                     "ddprun's tools the job's secret (DDPRUN_STORE_SECRET or "
                     "DDPRUN_STORE_SECRET_FILE)"
               : why == Refusal::bad_proof
                   ? "authentication failed: a wrong proof (a wrong secret, or a replayed "
                     "exchange)"
                   : "authentication failed: AUTH without a HELLO challenge, or a second AUTH");
  }
  closing_ = true;
  flush();
}

}  // namespace ddp::rdzv
