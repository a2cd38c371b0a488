// StoreServer: the TCPStore-compatible server, embeddable in any process (the launcher hosts
// it on the master node) and wrapped by the ddprund daemon. Asio stays behind the pimpl.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/proto/opcodes.hpp"
#include "ddp/rdzv/access.hpp"
#include "ddp/rdzv/journal.hpp"
#include "ddp/rdzv/tls.hpp"

namespace ddp::rdzv {

struct ServerOptions {
  std::string host = "127.0.0.1";  // bound as given; "0.0.0.0" or "::" for every interface
  std::uint16_t port = 0;          // 0: the OS picks a free port; read it back with port()
  unsigned threads = 0;            // event-loop threads; 0: half the cores, 1 to 4
  proto::Limits limits;
  std::size_t max_connections = 65536;
  // Keys, values and queued items together, each counted with 64 bytes of overhead. A write
  // past it closes that client's connection with the reason; 0 disables the cap.
  std::size_t max_store_bytes = std::size_t{1} << 30;
  int backlog = 65535;  // capped by the kernel's net.core.somaxconn
  // Memory held for clients outside the table: unparsed input (partial frames), unsent
  // replies and wait registrations. Per connection and for all connections together; a
  // request that would go past either gets the reason and its connection is closed
  // (docs/rendezvous.md, "Budgets"). The per-connection budget must hold one largest request.
  std::size_t max_connection_bytes = std::size_t{96} << 20;
  std::size_t max_client_bytes = std::size_t{1} << 30;
  // Replies waiting to be sent past which a connection's input is no longer parsed or read
  // (TCP back-pressure) until they drain.
  std::size_t max_pending_reply_bytes = std::size_t{4} << 20;
  // A request whose first byte arrived must be complete within this; 0: no deadline.
  std::chrono::milliseconds frame_timeout{5000};
  // Live leases one connection may have granted (bound or with a ttl); 0: no limit.
  std::size_t max_leases_per_connection = 1024;
  // Who may use the store (access.hpp, docs/security.md). `secret` (empty: none): peers outside
  // `trusted` must authenticate (AUTH) before any request. Without a secret, `closed` refuses
  // them at connect; otherwise everyone is admitted, as torch's TCPStore does.
  std::string secret;
  std::vector<Cidr> trusted;
  bool closed = false;
  // Set: a peer on loopback is admitted only when its socket belongs to this process's user,
  // root or one of these uids (peer_uid.hpp; docs/security.md). Unset: any local user.
  std::optional<std::vector<std::uint32_t>> loopback_uids;
  // TLS (store_tls.hpp; null: plain only): a server context. A connection whose first byte is a
  // TLS handshake record is served over TLS and, its certificate checked, needs no secret;
  // others are plain, judged as above. `tls_only`: plain ones are refused unless on loopback.
  std::shared_ptr<const TlsContext> tls;
  bool tls_only = false;
  // ddprund --data-dir (journal.hpp): the state survives a restart. Empty: memory only.
  std::string data_dir;
  std::chrono::milliseconds fsync_interval{1000};  // 0: fdatasync before every reply
  std::size_t journal_compact_bytes = std::size_t{64} << 20;
};

// Requests as the server's counters group them (the `op` label of the store metrics).
enum class OpKind : std::uint8_t {
  set,  // SET, SET_WITH_LEASE
  compare_set,
  get,
  add,
  check,
  wait,  // WAIT, BARRIER
  num_keys,
  delete_key,
  append,
  multi_get,
  multi_set,
  lease,  // LEASE_GRANT, LEASE_KEEPALIVE, LEASE_REVOKE, LEASE_WILL
  other,  // VALIDATE, HELLO, PING, CANCEL_WAIT, the queue ops, LIST_KEYS
};
inline constexpr std::size_t kOpKinds = static_cast<std::size_t>(OpKind::other) + 1;

constexpr OpKind op_kind(proto::Op op) {
  using proto::Op;
  switch (op) {
    case Op::set:
    case Op::set_with_lease: return OpKind::set;
    case Op::compare_set: return OpKind::compare_set;
    case Op::get: return OpKind::get;
    case Op::add: return OpKind::add;
    case Op::check: return OpKind::check;
    case Op::wait:
    case Op::barrier: return OpKind::wait;
    case Op::num_keys: return OpKind::num_keys;
    case Op::delete_key: return OpKind::delete_key;
    case Op::append: return OpKind::append;
    case Op::multi_get: return OpKind::multi_get;
    case Op::multi_set: return OpKind::multi_set;
    case Op::lease_grant:
    case Op::lease_keepalive:
    case Op::lease_revoke:
    case Op::lease_will: return OpKind::lease;
    default: return OpKind::other;
  }
}

// "set", "compare_set", "get", "add", "check", "wait", "num_keys", "delete", "append",
// "multi_get", "multi_set", "lease", "other".
std::string_view op_kind_name(OpKind kind);

struct ServerStats {
  std::uint64_t connections_open = 0;
  std::uint64_t connections_total = 0;
  std::uint64_t connections_refused = 0;  // over max_connections
  std::uint64_t requests = 0;             // the sum of requests_by_op
  std::uint64_t protocol_errors = 0;      // connections closed for a bad request
  std::uint64_t frame_timeouts = 0;       // closed: a request not finished within frame_timeout
  std::uint64_t over_budget = 0;          // closed: over max_connection_bytes or max_client_bytes
  std::uint64_t client_bytes = 0;         // held for all connections now (input, replies, waits)
  std::array<std::uint64_t, kOpKinds> requests_by_op{};  // indexed by OpKind
  std::uint64_t bytes_received = 0;                      // read from clients, since start
  std::uint64_t bytes_sent = 0;                          // written to clients, since start
  std::uint64_t keys = 0;                                // in the table now
  std::uint64_t table_bytes = 0;  // keys, values and queued items now (max_store_bytes' count)
  std::uint64_t leases = 0;       // live leases now
  // Access (docs/security.md): connections that authenticated, and refusals by reason.
  std::uint64_t auth_ok = 0;
  std::uint64_t refused_address = 0;          // a closed store, a peer outside its networks
  std::uint64_t refused_unauthenticated = 0;  // a request before authenticating
  std::uint64_t refused_user = 0;             // another user's socket on loopback
  std::uint64_t refused_plain = 0;            // plain, off the host, to a TLS-only store
  std::uint64_t refused_tls = 0;              // a failed TLS handshake
  std::uint64_t tls_connections = 0;          // served over TLS, since start
  std::uint64_t auth_failures = 0;            // a wrong proof, or AUTH without a challenge
  // --data-dir: the journal's size now, compactions since start, and whether writing it failed.
  bool journal = false;
  std::uint64_t journal_bytes = 0;
  std::uint64_t journal_compactions = 0;
  bool journal_failed = false;
};

class StoreServer {
 public:
  explicit StoreServer(ServerOptions options);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Binds and starts the event loops; throws ddp::IoError if the address cannot be bound and
  // ddp::ConfigError for budgets that cannot hold one largest request.
  void start();
  // With --data-dir, after start(): what the replay restored (journal.hpp).
  ReplayReport replayed() const;
  // Closes the listener and every connection, joins the loops. Idempotent.
  void stop();

  // Replaces the trusted networks (a new round's members); applies to connections from now on.
  void set_trusted(std::vector<Cidr> trusted);

  std::uint16_t port() const;
  const std::string& host() const;
  ServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddp::rdzv
