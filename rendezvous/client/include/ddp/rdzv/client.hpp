// StoreClient: blocking TCPStore client with timeouts, used by the launcher, the trainer and
// tests. Keys go on the wire as given (torch's Python client prepends "/"). One request in
// flight per client; calls from several threads are serialised.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/proto/opcodes.hpp"
#include "ddp/rdzv/endpoint.hpp"
#include "ddp/rdzv/store.hpp"
#include "ddp/rdzv/tls.hpp"

namespace ddp::rdzv {

struct ClientOptions {
  std::chrono::milliseconds timeout{30000};          // each reply, and the default wait
  std::chrono::milliseconds connect_timeout{60000};  // keep retrying connect until then
  // Send HELLO: replies carry a status byte, so server-side refusals arrive as messages.
  // Turn off to talk to a torch server.
  bool extensions = true;
  // While connecting: a readable fd here (the agent's signalfd) ends the attempts at once with
  // ddp::IoError "... connecting interrupted". -1: none.
  int cancel_fd = -1;
  // The job's secret (proto/auth.hpp; empty: none). With extensions, the client answers a
  // store's challenge with it right after HELLO (AUTH), and checks the store's own proof: a
  // store that does not hold the secret is refused. A store without a secret asks for none.
  std::string secret;
  // TLS (store_tls.hpp: store_client_tls() from DDPRUN_STORE_TLS_*; null: plain). The store's
  // certificate must be signed by the context's CA and name the host dialed; this client shows
  // its own. A store reached over TLS asks for no secret: the certificates authenticate both.
  std::shared_ptr<const TlsContext> tls;
};

class StoreClient : public Store {
 public:
  // The one dialer: resolves, connects with exponential backoff and jitter until
  // connect_timeout (or cancel_fd), then VALIDATE (+ HELLO). Throws ddp::IoError when the store
  // cannot be reached, ddp::ProtocolError when what answers is not a ddprun store (it closed the
  // connection at HELLO: a torch TCPStore, say).
  StoreClient(std::string host, std::uint16_t port, ClientOptions options = {});
  StoreClient(const Endpoint& endpoint, ClientOptions options = {})
      : StoreClient(endpoint.host, endpoint.port, options) {}
  ~StoreClient() override;
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(std::string_view key, std::string_view value) override;
  std::string get(std::string_view key) override;  // waits for the key first, like torch
  std::int64_t add(std::string_view key, std::int64_t delta) override;
  std::string compare_set(std::string_view key, std::string_view expected,
                          std::string_view desired) override;
  bool check(const std::vector<std::string>& keys) override;
  // Throws ddp::TimeoutError naming the keys when they do not all appear in time.
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool delete_key(std::string_view key) override;
  std::int64_t num_keys() override;
  void append(std::string_view key, std::string_view value) override;
  std::vector<std::string> multi_get(const std::vector<std::string>& keys) override;  // waits first
  void multi_set(const std::vector<std::string>& keys,
                 const std::vector<std::string>& values) override;
  std::uint32_t ping(std::uint32_t nonce);
  void queue_push(std::string_view key, std::string_view value);
  std::optional<std::string> queue_pop(std::string_view key);  // nullopt when empty
  std::int64_t queue_len(std::string_view key);
  std::vector<std::string> list_keys() override;
  void barrier(std::string_view key, std::int64_t world_size, std::chrono::milliseconds timeout);

  // Leases (ddprun extension; needs extensions = true and a ddprund server).
  std::uint64_t lease_grant(std::chrono::milliseconds ttl, bool bind_to_connection);
  bool lease_keepalive(std::uint64_t lease);
  bool lease_revoke(std::uint64_t lease);
  void set_with_lease(std::string_view key, std::string_view value, std::uint64_t lease);
  // The lease's will (see Op::lease_will); false if the lease is unknown or expired.
  bool lease_will(std::uint64_t lease, std::string_view key, std::string_view value);

  const std::string& endpoint() const { return endpoint_; }
  // Over TLS, and the handshake resumed an earlier session of the same context.
  bool tls_resumed() const { return tls_ && tls_->resumed(); }

  // Safe from any thread: the request in progress (a long WAIT, typically) and every later
  // reply fail with ddp::IoError "... interrupted". Used to stop a watcher thread.
  void interrupt();

 private:
  void connect();
  void start_tls(std::chrono::steady_clock::time_point give_up);
  void handshake();
  // The socket's bytes, through TLS when on: > 0 bytes moved; 0 from recv: the peer closed;
  // -1: errno says why (EAGAIN from recv: nothing yet, wait for POLLIN again).
  long io_send(const char* p, std::size_t n);
  long io_recv(char* p, std::size_t n);
  void wait_io(short events, std::chrono::steady_clock::time_point deadline);
  void finish_auth();
  bool lease_op(proto::Op op, std::uint64_t lease);
  void send_request();
  void rethrow_refusal();
  void read_exact(void* dst, std::size_t n, std::chrono::steady_clock::time_point deadline);
  bool wait_readable(std::chrono::steady_clock::time_point deadline);
  void expect_reply(std::chrono::steady_clock::time_point deadline);
  std::uint8_t read_u8();
  std::int64_t read_i64();
  std::string read_bytes();
  void await_stop(std::chrono::milliseconds timeout, const std::function<std::string()>& describe);
  void wait_locked(const std::vector<std::string>& keys, std::chrono::milliseconds timeout,
                   std::string_view what);
  std::chrono::steady_clock::time_point deadline() const;
  [[noreturn]] void broken(const std::string& why);

  std::string host_;
  std::uint16_t port_;
  std::string endpoint_;
  ClientOptions opts_;
  int fd_ = -1;
  int wake_fd_ = -1;                 // eventfd, written by interrupt()
  std::unique_ptr<TlsSession> tls_;  // over fd_ (non-blocking then) when opts_.tls
  std::string buf_;
  std::string in_;  // read ahead of the current reply: [in_pos_, size) is unread
  std::size_t in_pos_ = 0;
  bool peer_closed_ = false;  // the last read ended at EOF
  // AUTH was sent with the first request after it and not waited for: its reply (the store's
  // proof, expected to equal this) is read before the next reply.
  std::string auth_expect_;
  std::mutex mu_;
};

}  // namespace ddp::rdzv
