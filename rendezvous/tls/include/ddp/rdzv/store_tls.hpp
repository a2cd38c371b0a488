// The store's TLS (issue 35, docs/security.md "TLS on the store"): DDPRUN_STORE_TLS_CERT, _KEY
// and _CA, read once per binary, give every ddprun client (agents, ddpstore, `ddprun status`,
// ddp-train) and every store (ddprund, an agent's) the same node certificate and job CA:
// mutual TLS, each side checking the other against the CA, the client also checking that the
// store's certificate names the host it dialed. Stores take TLS and plain connections on one
// port: a TLS connection opens with a handshake record, whose first byte is 0x16, and no
// TCPStore request starts with that byte (torch's query types and ddprun's extensions stay
// below it). DDPRUN_STORE_TLS_ONLY=1 refuses plain connections except over loopback.
#pragma once

#include <memory>

#include "ddp/proto/knobs.hpp"
#include "ddp/rdzv/tls.hpp"

namespace ddp::rdzv {

inline constexpr unsigned char kTlsRecordHandshake = 0x16;

struct StoreTls {
  TlsOptions files;   // files.on: the three knobs are set
  bool only = false;  // DDPRUN_STORE_TLS_ONLY
};

// The knobs, checked: all three or none (ddp::ConfigError naming what is missing). The files
// themselves are checked when a context is made.
StoreTls store_tls(const knobs::Env* env = nullptr);
// A client context from the knobs, null when TLS is off. Throws ddp::ConfigError.
std::shared_ptr<const TlsContext> store_client_tls(const knobs::Env* env = nullptr);

}  // namespace ddp::rdzv
