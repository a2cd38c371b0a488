// One connection's admission: what may run before authenticating, and the AUTH check (gate.hpp).
#include "gate.hpp"

#include "ddp/proto/auth.hpp"
#include "ddp/proto/writer.hpp"

namespace ddp::rdzv {

using proto::Op;

std::string_view refusal_name(Refusal r) {
  switch (r) {
    case Refusal::none: return "none";
    case Refusal::unauthenticated: return "not authenticated";
    case Refusal::bad_proof: return "wrong authentication proof";
    case Refusal::no_challenge: return "AUTH without a HELLO challenge";
    case Refusal::address: return "address not admitted";
    case Refusal::user: return "another user's socket on loopback";
    case Refusal::plain: return "plain connection to a TLS-only store";
    case Refusal::tls: return "TLS handshake failed";
  }
  return "?";
}

bool Gate::wants_nonce(std::uint32_t version) const {
  return key_ != nullptr && version >= proto::auth::kAuthVersion;
}

bool Gate::allows(Op op, Refusal& refusal) const {
  if (open_ || op == Op::validate || op == Op::hello || op == Op::ping || op == Op::auth) {
    return true;
  }
  refusal = Refusal::unauthenticated;
  return false;
}

Refusal Gate::authenticate(const proto::Request& req, std::string& out) {
  proto::Writer w(out);
  if (key_ == nullptr) {  // nothing to prove: an empty server proof says so
    w.u8(proto::kReplyOk).bytes("");
    return Refusal::none;
  }
  if (nonce_.empty() || used_) return Refusal::no_challenge;
  used_ = true;
  const std::string_view client_nonce = req.keys.at(0), proof = req.values.at(0);
  if (client_nonce.size() < proto::auth::kNonceBytes ||
      !proto::auth::same(proof, proto::auth::client_proof(*key_, client_nonce, nonce_))) {
    return Refusal::bad_proof;
  }
  open_ = true;
  w.u8(proto::kReplyOk).bytes(proto::auth::server_proof(*key_, client_nonce, nonce_));
  return Refusal::none;
}

}  // namespace ddp::rdzv
