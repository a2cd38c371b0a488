// One connection's gate (gate.hpp), bytes in and out: what an unauthenticated connection may
// send, a good AUTH, a wrong one, a replayed one, a second one, and a store with no secret.
#include "gate.hpp"

#include <catch2/catch.hpp>

#include "support/hex.hpp"
#include "ddp/proto/auth.hpp"
#include "ddp/proto/writer.hpp"

using namespace ddp::rdzv;
using namespace ddp::proto;

namespace {
const std::string kSecret = "the-job-secret-0123456789";
const auth::Key kKey(kSecret);

struct Auth {
  std::string cn = auth::nonce();
  std::string proof;
  Request req;
  Auth(const std::string& secret, const std::string& server_nonce) {
    proof = auth::client_proof(secret, cn, server_nonce);
    req.op = Op::auth;
    req.keys = {cn};
    req.values = {proof};
  }
};
}  // namespace

TEST_CASE("before AUTH only VALIDATE, HELLO, PING and AUTH pass", "[unit][gate]") {
  Gate g(&kKey, false);
  Refusal why = Refusal::none;
  for (Op op : {Op::validate, Op::hello, Op::ping, Op::auth}) CHECK(g.allows(op, why));
  for (Op op : {Op::get, Op::set, Op::add, Op::wait, Op::list_keys, Op::lease_grant}) {
    CHECK_FALSE(g.allows(op, why));
    CHECK(why == Refusal::unauthenticated);
  }
  CHECK(Gate(&kKey, true).allows(Op::get, why));  // a trusted address
}

TEST_CASE("a good AUTH opens the gate and proves the server", "[unit][gate]") {
  Gate g(&kKey, false);
  CHECK(g.wants_nonce(2));
  CHECK_FALSE(g.wants_nonce(1));
  g.set_nonce(auth::nonce());
  Auth a(kSecret, g.nonce());
  std::string out;
  CHECK(g.authenticate(a.req, out) == Refusal::none);
  CHECK(g.open());
  std::string expect;
  Writer(expect).u8(kReplyOk).bytes(auth::server_proof(kSecret, a.cn, g.nonce()));
  CHECK(ddp::test::hex(out) == ddp::test::hex(expect));
}

TEST_CASE("a wrong secret, a replay, a second AUTH and AUTH without a challenge fail",
          "[unit][gate]") {
  std::string out;
  {
    Gate g(&kKey, false);
    g.set_nonce(auth::nonce());
    CHECK(g.authenticate(Auth("another-secret-0123456789", g.nonce()).req, out) ==
          Refusal::bad_proof);
    CHECK_FALSE(g.open());
  }
  {
    // The transcript of an earlier connection: its proof answers another nonce.
    Gate earlier(&kKey, false);
    earlier.set_nonce(auth::nonce());
    Auth recorded(kSecret, earlier.nonce());
    Gate g(&kKey, false);
    g.set_nonce(auth::nonce());
    CHECK(g.authenticate(recorded.req, out) == Refusal::bad_proof);
  }
  {
    Gate g(&kKey, false);
    g.set_nonce(auth::nonce());
    Auth bad("another-secret-0123456789", g.nonce());
    CHECK(g.authenticate(bad.req, out) == Refusal::bad_proof);
    CHECK(g.authenticate(Auth(kSecret, g.nonce()).req, out) == Refusal::no_challenge);  // once
  }
  {
    Gate g(&kKey, false);  // no HELLO v2 yet: nothing to answer
    CHECK(g.authenticate(Auth(kSecret, "").req, out) == Refusal::no_challenge);
  }
  {
    Gate g(&kKey, false);
    g.set_nonce(auth::nonce());
    Auth a(kSecret, g.nonce());
    a.req.keys = {"short"};  // a client nonce under 32 bytes
    a.req.values = {auth::client_proof(kSecret, "short", g.nonce())};
    CHECK(g.authenticate(a.req, out) == Refusal::bad_proof);
  }
  CHECK(out.empty());
}

TEST_CASE("a store without a secret answers AUTH with an empty proof", "[unit][gate]") {
  Gate g(nullptr, true);
  CHECK_FALSE(g.wants_nonce(2));
  std::string out;
  CHECK(g.authenticate(Auth(kSecret, "").req, out) == Refusal::none);
  CHECK(ddp::test::hex(out) == "000000000000000000");
}
