// StoreServer: binds the listener, runs one io_context per thread (connections are spread
// round-robin across them), sweeps expired leases, and tears everything down on stop().
// Every descriptor it opens is close-on-exec (the listener by SOCK_CLOEXEC, connections by
// accept4), so a process that embeds it can fork and exec without leaking the port.
#include "ddp/rdzv/server.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <algorithm>
#include <fstream>
#include <thread>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/log.hpp"
#include "ddp/rdzv/peer_uid.hpp"
#include "session.hpp"

namespace ddp::rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {
constexpr auto kSweepPeriod = std::chrono::milliseconds(50);
// A sweep this late means the process was not running (see sweep()).
constexpr auto kFrozenAfter = std::chrono::milliseconds(1500);
constexpr auto kCompactionCheck = std::chrono::milliseconds(1000);
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

// Half the cores, 1 to 4: the store shares its host with an agent and workers, and on small
// hosts one loop wastes less on cross-core hand-offs than it gains (docs/perf.md).
unsigned default_threads() {
  unsigned hw = std::thread::hardware_concurrency();
  return std::clamp(hw / 2, 1u, 4u);
}

// Options set once on the listener; Linux copies them into every accepted socket. Keep-alive
// makes a vanished peer (power loss) release its connection-bound leases in about 30 s.
void set_inherited_options(tcp::acceptor& a) {
  boost::system::error_code ec;
  a.set_option(tcp::no_delay(true), ec);
  a.set_option(asio::socket_base::keep_alive(true), ec);
  int fd = a.native_handle();
  int idle = 15, intvl = 5, cnt = 3;
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

void warn_small_backlog(int wanted) {
  std::ifstream f("/proc/sys/net/core/somaxconn");
  int somaxconn = 0;
  if (f >> somaxconn && somaxconn < wanted && somaxconn < 4096) {
    logger("rdzv").warn(
        "net.core.somaxconn is {}: connection storms above that many clients may see resets "
        "(raise it with sysctl -w net.core.somaxconn=65535)",
        somaxconn);
  }
}
}  // namespace

struct StoreServer::Impl {
  ServerOptions opts;
  SharedState shared;
  std::vector<std::unique_ptr<asio::io_context>> loops;
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> guards;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::unique_ptr<asio::steady_timer> sweeper;
  std::unique_ptr<asio::steady_timer> accept_retry;
  std::vector<std::thread> threads;
  std::atomic<WaiterId> next_id{1};
  std::size_t next_loop = 0;
  std::uint16_t port = 0;
  tcp protocol = tcp::v4();  // the listener's, for every accepted socket (no getsockname each)
  bool started = false, stopped = false;

  explicit Impl(ServerOptions o) : opts(std::move(o)) {
    shared.limits = opts.limits;
    shared.max_connection_bytes = opts.max_connection_bytes;
    shared.max_client_bytes = opts.max_client_bytes;
    shared.max_pending_reply_bytes = opts.max_pending_reply_bytes;
    shared.frame_timeout = opts.frame_timeout;
    shared.max_leases_per_connection = opts.max_leases_per_connection;
    if (!opts.secret.empty()) shared.key = std::make_unique<proto::auth::Key>(opts.secret);
    shared.policy.has_secret = !opts.secret.empty();
    shared.policy.trusted = opts.trusted;
    shared.policy.closed = opts.closed;
    if (opts.loopback_uids && !peer_uid_works()) {
      logger("rdzv").warn(
          "cannot tell who owns a local socket here (no sock_diag?): loopback admits every user");
    } else if (opts.loopback_uids) {
      shared.policy.by_user = true;
      shared.policy.own_uid = ::geteuid();
      shared.policy.uids = *opts.loopback_uids;
    }
    shared.tls = opts.tls;
    shared.tls_only = opts.tls && opts.tls_only;
    shared.table.set_max_bytes(opts.max_store_bytes);
  }

  // A connection's budget must hold its reply buffers at their fullest (two strings of up to
  // twice the reply cap plus one largest value each, as strings double) and one largest
  // value's request; the global budget at least one connection.
  void check_budgets() const {
    const std::size_t replies = 4 * (opts.max_pending_reply_bytes + opts.limits.max_value_bytes);
    const std::size_t request = opts.limits.max_value_bytes + opts.limits.max_key_bytes;
    const std::size_t need = std::max(replies, request) + 64 * 1024;
    if (opts.max_pending_reply_bytes == 0) {
      DDP_THROW(ConfigError, "the pending-reply cap must be > 0");
    }
    if (opts.max_connection_bytes < need) {
      DDP_THROW(ConfigError, "--max-connection-bytes " + std::to_string(opts.max_connection_bytes) +
                                 " is below " + std::to_string(need) +
                                 ": a connection must hold its reply buffers at their fullest, 4 x "
                                 "(the 4 MiB reply cap + --max-value-bytes " +
                                 std::to_string(opts.limits.max_value_bytes) + "), + 64 KiB");
    }
    if (opts.max_client_bytes < opts.max_connection_bytes) {
      DDP_THROW(ConfigError, "--max-client-bytes " + std::to_string(opts.max_client_bytes) +
                                 " is below --max-connection-bytes " +
                                 std::to_string(opts.max_connection_bytes));
    }
  }

  void bind() {
    unsigned n = opts.threads ? opts.threads : default_threads();
    for (unsigned i = 0; i < n; ++i) {
      loops.push_back(std::make_unique<asio::io_context>(1));
      guards.push_back(asio::make_work_guard(*loops.back()));
    }
    auto& io = *loops[0];
    boost::system::error_code ec;
    tcp::resolver resolver(io);
    auto results =
        resolver.resolve(opts.host, std::to_string(opts.port), tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) {
      DDP_THROW(IoError, "cannot resolve listen address '" + opts.host + "': " + ec.message());
    }
    tcp::endpoint ep = results.begin()->endpoint();
    acceptor = std::make_unique<tcp::acceptor>(io);
    const int lfd =
        ::socket(ep.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_TCP);
    if (lfd < 0) {
      DDP_THROW(IoError, "cannot open a listening socket: " + std::string(std::strerror(errno)));
    }
    protocol = ep.protocol();
    acceptor->assign(protocol, lfd, ec);
    if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec && ep.address().is_v6()) acceptor->set_option(asio::ip::v6_only(false), ec);
    if (!ec) set_inherited_options(*acceptor);
    if (!ec) acceptor->bind(ep, ec);
    if (!ec) acceptor->listen(opts.backlog, ec);
    if (ec) {
      DDP_THROW(IoError, "cannot listen on " + opts.host + ":" + std::to_string(opts.port) + ": " +
                             ec.message());
    }
    port = acceptor->local_endpoint().port();
    warn_small_backlog(opts.backlog);
    sweeper = std::make_unique<asio::steady_timer>(io);
    accept_retry = std::make_unique<asio::steady_timer>(io);
  }

  // Waits for the listener to be readable, then takes what is queued with accept4 so that
  // every connection is close-on-exec from its first instant.
  void accept() {
    acceptor->async_wait(tcp::acceptor::wait_read, [this](const boost::system::error_code& ec) {
      if (ec == asio::error::operation_aborted) return;
      for (int i = 0; i < 64 && !ec; ++i) {  // a burst; the rest on the next turn
        sockaddr_storage peer{};
        socklen_t len = sizeof(peer);
        int fd = ::accept4(acceptor->native_handle(), reinterpret_cast<sockaddr*>(&peer), &len,
                           SOCK_CLOEXEC);
        if (fd >= 0) {
          admit(fd, from_sockaddr(reinterpret_cast<const sockaddr*>(&peer)));
          continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
          break;
        }
        // EMFILE and friends: back off instead of spinning on a full fd table.
        logger("rdzv").warn("accept failed: {}; retrying", std::strerror(errno));
        accept_retry->expires_after(kAcceptRetry);
        accept_retry->async_wait([this](const boost::system::error_code& e) {
          if (!e) accept();
        });
        return;
      }
      if (ec) logger("rdzv").warn("waiting for connections failed: {}", ec.message());
      accept();
    });
  }

  // Who may connect (access.hpp): a refused peer is closed before it costs a session.
  // On loopback, a by-user store asks the kernel whose socket the peer is first.
  void admit(int fd, const IpAddr& peer) {
    Access access;
    bool by_user = false;
    {
      std::lock_guard<std::mutex> g(shared.policy_mu);
      by_user = needs_uid(shared.policy, peer);
    }
    const std::optional<std::uint32_t> uid = by_user ? local_peer_uid(fd) : std::nullopt;
    {
      std::lock_guard<std::mutex> g(shared.policy_mu);
      access = classify(shared.policy, peer, uid);
    }
    if (access == Access::refuse) {
      ::close(fd);
      shared.audit(by_user ? Refusal::user : Refusal::address,
                   by_user ? peer.str() + " (uid " + (uid ? std::to_string(*uid) : "unknown") + ")"
                           : peer.str());
      return;
    }
    adopt(fd, access == Access::admit);
  }

  void adopt(int fd, bool admitted) {
    auto& target = *loops[next_loop];
    next_loop = (next_loop + 1) % loops.size();
    tcp::socket s(target);
    boost::system::error_code ec;
    s.assign(protocol, fd, ec);
    if (ec) {
      ::close(fd);
      return;
    }
    on_accept(std::move(s), admitted);
  }

  void on_accept(tcp::socket s, bool admitted) {
    if (shared.connections_open.load() >= opts.max_connections) {
      shared.connections_refused.fetch_add(1);
      logger("rdzv").warn("refusing a connection: the limit of {} connections is reached",
                          opts.max_connections);
      boost::system::error_code ignored;
      s.close(ignored);
      return;
    }
    WaiterId id = next_id.fetch_add(1);
    auto session = std::make_shared<Session>(std::move(s), shared, id, admitted);
    {
      std::lock_guard<std::mutex> g(shared.mu);
      shared.sessions.emplace(id, session);
    }
    shared.connections_open.fetch_add(1);
    shared.connections_total.fetch_add(1);
    asio::post(session->executor(), [session] { session->start(); });
  }

  // Expires leases on the server's clock: the timer is set for the next lease to expire
  // (at most kSweepPeriod away), so a will fires within about a millisecond of its TTL.
  // A timer that fires this late means the server did not run (SIGSTOP, a suspended host or
  // VM): nobody could renew a lease meanwhile, so the leases get that time back.
  void sweep() {
    Millis wait = kSweepPeriod;
    {
      std::lock_guard<std::mutex> g(shared.mu);
      if (auto next = shared.table.next_expiry()) {
        wait = std::clamp(*next - shared.now() + Millis(1), Millis(1), kSweepPeriod);
      }
    }
    const Millis due = shared.now() + wait;
    sweeper->expires_after(wait);
    sweeper->async_wait([this, due](const boost::system::error_code& ec) {
      if (ec) return;
      std::vector<std::shared_ptr<Session>> wake;
      bool compact = false;
      {
        std::lock_guard<std::mutex> g(shared.mu);
        const Millis late = shared.now() - due;
        if (late > kFrozenAfter) {
          shared.table.extend_leases(late);
          logger("rdzv").warn(
              "the store did not run for {:.1f} s (stopped, or its host suspended); every "
              "lease gets that time back",
              static_cast<double>(late.count()) / 1000);
        }
        Woken woken;  // wills of expired leases
        shared.table.expire(shared.now(), woken);
        wake = claim_wakes(shared, woken);
        if (shared.journal && shared.now() >= next_compaction_check) {
          next_compaction_check = shared.now() + kCompactionCheck;
          compact = shared.journal->wants_compaction();
          if (compact) shared.journal->compact(shared.table);
        }
      }
      shared.commit();
      post_wakes(wake);
      sweep();
    });
  }
  Millis next_compaction_check{0};
};

StoreServer::StoreServer(ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

StoreServer::~StoreServer() { stop(); }

void StoreServer::start() {
  auto& m = *impl_;
  if (m.started) return;
  m.check_budgets();
  if (!m.opts.data_dir.empty()) {
    JournalOptions jo{m.opts.data_dir, m.opts.fsync_interval, m.opts.journal_compact_bytes};
    m.shared.journal = std::make_unique<Journal>(jo, m.shared.table, m.shared.now());
  }
  m.bind();
  m.started = true;
  m.accept();
  m.sweep();
  for (auto& loop : m.loops) {
    m.threads.emplace_back([io = loop.get()] {
      try {
        io->run();
      } catch (const std::exception& e) {
        logger("rdzv").critical("event loop stopped by an exception: {}", e.what());
      }
    });
  }
}

void StoreServer::stop() {
  auto& m = *impl_;
  if (!m.started || m.stopped) return;
  m.stopped = true;
  for (auto& loop : m.loops) loop->stop();
  for (auto& t : m.threads) t.join();
  boost::system::error_code ignored;
  m.acceptor->close(ignored);
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard<std::mutex> g(m.shared.mu);
    for (auto& [id, weak] : m.shared.sessions) {
      if (auto s = weak.lock()) live.push_back(std::move(s));
    }
    m.shared.sessions.clear();
  }
  for (auto& s : live) s->abort();
  m.shared.journal.reset();  // the last records written and synced
}

ReplayReport StoreServer::replayed() const {
  return impl_->shared.journal ? impl_->shared.journal->replayed() : ReplayReport{};
}

void StoreServer::set_trusted(std::vector<Cidr> trusted) {
  auto& s = impl_->shared;
  std::lock_guard<std::mutex> g(s.policy_mu);
  s.policy.trusted = std::move(trusted);
}

std::uint16_t StoreServer::port() const { return impl_->port; }
const std::string& StoreServer::host() const { return impl_->opts.host; }

// Counters are read relaxed (each exact, not a snapshot of all at one instant); the table's
// sizes under its lock, held for three loads.
ServerStats StoreServer::stats() const {
  auto& s = impl_->shared;
  constexpr auto relaxed = std::memory_order_relaxed;
  ServerStats st;
  st.connections_open = s.connections_open.load(relaxed);
  st.connections_total = s.connections_total.load(relaxed);
  st.connections_refused = s.connections_refused.load(relaxed);
  st.protocol_errors = s.protocol_errors.load(relaxed);
  st.frame_timeouts = s.frame_timeouts.load(relaxed);
  st.over_budget = s.over_budget.load(relaxed);
  st.client_bytes = s.client_bytes.load(relaxed);
  for (std::size_t i = 0; i < kOpKinds; ++i) {
    st.requests_by_op[i] = s.requests[i].load(relaxed);
    st.requests += st.requests_by_op[i];
  }
  st.bytes_received = s.bytes_received.load(relaxed);
  st.bytes_sent = s.bytes_sent.load(relaxed);
  st.auth_ok = s.auth_ok.load(relaxed);
  auto refused = [&](Refusal r) { return s.refusals[static_cast<std::size_t>(r)].load(relaxed); };
  st.refused_address = refused(Refusal::address);
  st.refused_unauthenticated = refused(Refusal::unauthenticated);
  st.refused_user = refused(Refusal::user);
  st.refused_plain = refused(Refusal::plain);
  st.refused_tls = refused(Refusal::tls);
  st.tls_connections = s.tls_connections.load(relaxed);
  st.auth_failures = refused(Refusal::bad_proof) + refused(Refusal::no_challenge);
  {
    std::lock_guard<std::mutex> g(s.mu);
    st.keys = s.table.num_keys();
    st.table_bytes = s.table.bytes();
    st.leases = s.table.num_leases();
  }
  if (s.journal) {
    st.journal = true;
    st.journal_bytes = s.journal->journal_bytes();
    st.journal_compactions = s.journal->compactions();
    st.journal_failed = s.journal->failed();
  }
  return st;
}

std::string_view op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::set: return "set";
    case OpKind::compare_set: return "compare_set";
    case OpKind::get: return "get";
    case OpKind::add: return "add";
    case OpKind::check: return "check";
    case OpKind::wait: return "wait";
    case OpKind::num_keys: return "num_keys";
    case OpKind::delete_key: return "delete";
    case OpKind::append: return "append";
    case OpKind::multi_get: return "multi_get";
    case OpKind::multi_set: return "multi_set";
    case OpKind::lease: return "lease";
    case OpKind::other: return "other";
  }
  return "other";
}

}  // namespace ddp::rdzv
