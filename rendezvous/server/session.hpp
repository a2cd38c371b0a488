// One client connection of the store server: read bytes -> decode -> dispatch under the shared
// lock -> write replies. Also delivers deferred STOP_WAITING replies posted by other threads.
#pragma once

#include <array>
#include <atomic>
#include <utility>  // before Asio: Boost 1.74 awaitable.hpp needs std::exchange

#include <boost/asio.hpp>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ddp/proto/decoder.hpp"
#include "ddp/rdzv/journal.hpp"
#include "ddp/rdzv/kv_table.hpp"
#include "ddp/rdzv/server.hpp"
#include "ddp/proto/opcodes.hpp"
#include "ddp/rdzv/access.hpp"
#include "gate.hpp"

namespace ddp::rdzv {

class Session;

// State shared by every loop thread. `mu` guards `table` and `sessions`.
struct SharedState {
  std::mutex mu;
  KvTable table;
  // ddprund --data-dir (journal.hpp; null: none): committed before replies and wake-ups go out.
  std::unique_ptr<Journal> journal;
  void commit() {
    if (journal) journal->commit();
  }
  std::unordered_map<WaiterId, std::weak_ptr<Session>> sessions;
  proto::Limits limits;
  std::size_t max_connection_bytes = 0, max_client_bytes = 0, max_pending_reply_bytes = 0;
  std::chrono::milliseconds frame_timeout{0};
  std::size_t max_leases_per_connection = 0;
  std::atomic<std::size_t> client_bytes{0};  // Session::held_ summed over every connection
  // The same beyond each connection's allowance: what --max-client-bytes bounds.
  std::atomic<std::size_t> client_excess{0};
  std::chrono::steady_clock::time_point epoch = std::chrono::steady_clock::now();
  std::atomic<std::uint64_t> connections_open{0}, connections_total{0}, connections_refused{0},
      protocol_errors{0}, frame_timeouts{0}, over_budget{0};
  // Counted relaxed, one add per request (by kind), per read and per write: no lock.
  std::array<std::atomic<std::uint64_t>, kOpKinds> requests{};
  std::atomic<std::uint64_t> bytes_received{0}, bytes_sent{0};
  // Access (access.hpp): the secret's key (fixed at start), the policy (replaced by set_trusted,
  // read at each accept), refusals by reason and their rate-limited log (audit.cpp).
  std::unique_ptr<const proto::auth::Key> key;  // the secret's (null: none)
  std::mutex policy_mu;
  AccessPolicy policy;
  std::atomic<std::uint64_t> auth_ok{0};
  std::array<std::atomic<std::uint64_t>, kRefusals> refusals{};  // indexed by Refusal
  // TLS (ServerOptions::tls; null: none): the server context (tls.hpp).
  std::shared_ptr<const TlsContext> tls;
  bool tls_only = false;
  std::atomic<std::uint64_t> tls_connections{0};
  std::mutex audit_mu;
  LogRateLimit audit_limit{10, std::chrono::seconds(10)};
  // Counts the refusal and logs "refused <peer>: <reason>" within the rate limit.
  void audit(Refusal why, const std::string& peer);

  Millis now() const {
    return std::chrono::duration_cast<Millis>(std::chrono::steady_clock::now() - epoch);
  }
};

// Wake-ups found under shared.mu: counts one for each woken session that still exists and
// returns them; post_wakes() (no lock needed) makes each deliver its STOP_WAITING on its loop.
std::vector<std::shared_ptr<Session>> claim_wakes(SharedState& shared, const Woken& woken);
void post_wakes(std::vector<std::shared_ptr<Session>>& sessions);

class Session : public std::enable_shared_from_this<Session> {
 public:
  // `admitted`: may use the store without authenticating (classify() said admit).
  Session(boost::asio::ip::tcp::socket socket, SharedState& shared, WaiterId id, bool admitted);
  ~Session();
  void start();
  // Called on the session's own loop after a waker bumped `wakes_issued`.
  void deliver_wakes();
  // Closes the socket without touching shared state (server shutdown, loops stopped).
  void abort();

  WaiterId id() const { return id_; }
  boost::asio::any_io_executor executor() { return socket_.get_executor(); }

  // Incremented under SharedState::mu by whoever's change woke this session's wait.
  std::atomic<std::uint64_t> wakes_issued{0};

 private:
  // With TLS on: the first byte (peeked) says TLS or plain; TLS goes through its handshake,
  // bounded by the frame timeout, before the first read.
  void sniff();
  void start_tls();
  // TLS on the socket itself (session_tls.cpp): OpenSSL reads and writes the non-blocking fd;
  // Asio only says when it is readable or writable. `posted`: the caller is not a handler, so a
  // result is delivered through the loop (no recursion into pump()).
  void tls_handshake(std::uint64_t gen);
  void tls_read(char* into, std::size_t n, bool posted);
  void tls_write(std::size_t off, bool posted);
  void on_written(const boost::system::error_code& ec, std::size_t n);
  void read();
  void on_read(const boost::system::error_code& ec, std::size_t n);
  // Parses what is buffered, sends the replies, and reads on while the replies are under
  // their cap: the one step after a read and after a write.
  void pump();
  void process();
  bool output_full() const;
  // Memory accounting (docs/rendezvous.md "Budgets"): held_ = buffers + wait registration.
  void account();
  bool reserve(std::size_t extra);
  std::size_t room_left() const;
  void over_budget(const std::string& what, std::size_t need);
  bool grow_input();
  void arm_frame_deadline(bool partial, bool progressed);
  bool handle(const proto::Request& req);
  void cancel_wait(bool reply);
  void fail(const std::string& why);
  // Closes for an access refusal: counted and logged by SharedState::audit, not by fail().
  void refuse(Refusal why);
  bool gate(const proto::Request& req);
  std::string peer();
  void flush();
  void close();

  boost::asio::ip::tcp::socket socket_;
  SSL* ssl_ = nullptr;  // over socket_'s fd when the peer spoke TLS
  SharedState& shared_;
  WaiterId id_;
  proto::Decoder decoder_;
  Gate gate_;
  proto::Request req_;
  std::unique_ptr<char[]> in_;  // [in_begin_, in_end_) holds unparsed bytes; not zero-filled
  std::size_t in_cap_ = 0, in_begin_ = 0, in_end_ = 0;
  std::string out_, writing_;
  std::size_t held_ = 0;        // counted in shared_.client_bytes
  std::size_t wait_bytes_ = 0;  // estimate of the pending WAIT's registration
  boost::asio::steady_timer frame_timer_;
  std::uint64_t frame_gen_ = 0;  // a timer whose generation moved on is stale
  bool frame_armed_ = false;
  bool validated_ = false;
  bool plain_refused_ = false;  // plain, off the host, to a TLS-only store  // a VALIDATE was seen
                                // (a second one is refused)
  Woken woken_;
  std::uint64_t wakes_delivered_ = 0;
  bool wait_pending_ = false;
  bool status_prefix_ = false;
  bool reading_ = false;
  bool closing_ = false;  // no more reads; close once the last write is out
  bool closed_ = false;
};

}  // namespace ddp::rdzv
