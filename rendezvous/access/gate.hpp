// Gate: one connection's admission state (docs/security.md). A connection that must
// authenticate may only VALIDATE, HELLO, PING and AUTH; its AUTH proof is checked against the
// nonce its HELLO reply carried. Pure (no sockets, no locks), unit-tested byte for byte.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "ddp/proto/auth.hpp"
#include "ddp/proto/decoder.hpp"

namespace ddp::rdzv {

// Why a connection was refused: the audit counters and log lines.
enum class Refusal : std::uint8_t {
  none,
  unauthenticated,  // a request other than VALIDATE/HELLO/PING/AUTH before authenticating
  bad_proof,        // AUTH with a wrong proof (wrong secret, replayed transcript)
  no_challenge,     // AUTH without a HELLO (version >= 2) nonce to answer
  address,          // a peer outside the trusted networks of a closed store
  user,             // a loopback peer whose socket belongs to another user
  plain,            // a plain connection from off the host to a TLS-only store
  tls,              // a failed TLS handshake (no client certificate, or an untrusted one)
};
inline constexpr std::size_t kRefusals = static_cast<std::size_t>(Refusal::tls) + 1;
std::string_view refusal_name(Refusal r);

class Gate {
 public:
  // `key`: the server's secret (null: none; must outlive the gate). `admitted`: the peer may
  // use the store without authenticating (a trusted address, or no secret).
  Gate(const proto::auth::Key* key, bool admitted) : key_(key), open_(admitted) {}

  bool open() const { return open_; }
  // The peer proved itself another way (a client certificate the store's CA signed).
  void admit() { open_ = true; }
  // HELLO: whether its reply carries a fresh nonce (from version 2, when the server has a
  // secret; else the nonce is empty). The caller makes it (auth::nonce) and sets it.
  bool wants_nonce(std::uint32_t version) const;
  void set_nonce(std::string nonce) { nonce_ = std::move(nonce); }
  const std::string& nonce() const { return nonce_; }

  // Whether `op` may run now; otherwise `refusal` says why (the connection must close).
  bool allows(proto::Op op, Refusal& refusal) const;
  // AUTH: appends the reply (status-prefixed, as AUTH always follows HELLO) and opens the gate,
  // or returns the refusal and leaves `out` alone. A nonce is answered once: a second AUTH on
  // the connection is checked against nothing and refused.
  Refusal authenticate(const proto::Request& req, std::string& out);

 private:
  const proto::auth::Key* key_;
  bool open_;
  std::string nonce_;
  bool used_ = false;
};

}  // namespace ddp::rdzv
