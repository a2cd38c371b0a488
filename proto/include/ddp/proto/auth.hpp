// Challenge-response authentication of store clients (docs/wire_protocol.md, "AUTH"): both
// proofs are HMAC-SHA256 under the job's secret over the client's and the server's nonce, so
// the secret never crosses the wire and a recorded transcript fails on any other connection
// (each gets a fresh server nonce). Also where a binary finds the job's secret (an environment
// variable or a file only its owner can read; never the command line). Pure but for the OS's
// random numbers and the secret file.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "ddp/proto/knobs.hpp"

namespace ddp::proto::auth {

inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kProofBytes = 32;  // HMAC-SHA256
inline constexpr std::size_t kMinSecretBytes = 16;
inline constexpr std::size_t kMaxSecretBytes = 4096;
// The HELLO version from which the server's reply carries its nonce.
inline constexpr std::uint32_t kAuthVersion = 2;

// kNonceBytes from the kernel's CSPRNG (getrandom: 0.6 µs here, RAND_bytes took 1 µs);
// throws ddp::IoError if it fails.
std::string nonce();
std::string hmac_sha256(std::string_view key, std::string_view message);

// An HMAC-SHA256 key whose padded blocks are hashed once (RFC 2104): a MAC then hashes only
// the message, about a third of HMAC()'s cost. Immutable once built, so threads share one
// (a store's event loops do).
class Key {
 public:
  explicit Key(std::string_view secret);
  ~Key();
  Key(const Key&) = delete;
  Key& operator=(const Key&) = delete;
  std::string mac(std::string_view message) const;

 private:
  struct Ctx;
  Ctx* inner_;
  Ctx* outer_;
};
// What the client sends, and what the server answers, for one pair of nonces. Distinct labels,
// so one can never stand in for the other.
std::string client_proof(std::string_view secret, std::string_view client_nonce,
                         std::string_view server_nonce);
std::string server_proof(std::string_view secret, std::string_view client_nonce,
                         std::string_view server_nonce);
std::string client_proof(const Key& key, std::string_view client_nonce,
                         std::string_view server_nonce);
std::string server_proof(const Key& key, std::string_view client_nonce,
                         std::string_view server_nonce);
// Constant-time comparison (the time does not tell how many leading bytes matched).
bool same(std::string_view a, std::string_view b);

// The secret in a file: owned by this user, no access for group or others (as ssh demands of a
// private key), kMinSecretBytes to kMaxSecretBytes after one trailing newline is dropped.
// Throws ddp::ConfigError naming the path and what is wrong; the secret itself never appears.
std::string read_secret_file(const std::string& path);
// Bounds a secret's length; `origin` names where it came from in the error.
std::string checked_secret(std::string secret, std::string_view origin);

// The job's secret: DDPRUN_STORE_SECRET_FILE (a file, read_secret_file) or DDPRUN_STORE_SECRET
// (the value); both set is an error; nullopt when neither is. From `env`, or the process's.
std::optional<std::string> job_secret(const knobs::Env* env = nullptr);
// A binary's secret: its --secret-file when given (then DDPRUN_STORE_SECRET(_FILE) must not be
// set too), else job_secret(env). ddprund and ddpstore take the same spelling.
std::optional<std::string> secret_for(const std::string& secret_file,
                                      const knobs::Env* env = nullptr);

}  // namespace ddp::proto::auth
