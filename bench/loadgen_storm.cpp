// loadgen_storm: store_loadgen --mode storm: N clients connect at once and do
// init_process_group's ADD + WAIT barrier -> one JSON line with the wall time.
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "ddp/proto/writer.hpp"
#include "loadgen_modes.hpp"
#include "loadgen_wire.hpp"

namespace loadgen {
namespace {

struct StormShared {
  Endpoint ep;
  std::int64_t clients = 0;
  std::string count_key, done_key;
  std::uint64_t t0 = 0, deadline = 0;
};

enum class Stage : std::uint8_t { backoff, connecting, adding, waiting, done, failed };

struct StormClient {
  int fd = -1;
  Stage stage = Stage::backoff;
  bool added = false;  // the ADD reply arrived: a reconnect only re-sends the WAIT
  int attempts = 0;
  std::uint64_t retry_at = 0;
  std::string out, in;
  std::size_t out_off = 0;
};

struct StormThread {
  const StormShared* s = nullptr;
  std::vector<StormClient> clients;
  std::uint64_t retries = 0, resets = 0, errors = 0, last_done = 0;
  std::size_t finished = 0;  // done or failed
  std::size_t done = 0;
  int epfd = -1;
  Rng rng{0};

  static bool transient(int err) {
    return err == ECONNREFUSED || err == ECONNRESET || err == ETIMEDOUT || err == EAGAIN ||
           err == EADDRNOTAVAIL || err == EINTR || err == EPIPE;
  }

  void close_fd(StormClient& c) {
    if (c.fd >= 0) ::close(c.fd);  // closing also removes it from the epoll set
    c.fd = -1;
  }

  void give_up(StormClient& c) {
    close_fd(c);
    c.stage = Stage::failed;
    ++errors;
    ++finished;
  }

  // Backoff 2, 4, 8 ... 256 ms with jitter in [0.5, 1.5).
  void retry_later(StormClient& c) {
    close_fd(c);
    ++retries;
    int shift = std::min(c.attempts++, 7);
    std::uint64_t base = (2 * kMs) << shift;
    c.retry_at = now_ns() + base / 2 + rng.below(base);
    c.stage = Stage::backoff;
  }

  void start(std::uint32_t idx) {
    StormClient& c = clients[idx];
    c.fd = ::socket(s->ep.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) return give_up(c);
    set_nodelay(c.fd);
    c.in.clear();
    int rc = ::connect(c.fd, reinterpret_cast<const sockaddr*>(&s->ep.addr), s->ep.len);
    if (rc != 0 && errno != EINPROGRESS) return transient(errno) ? retry_later(c) : give_up(c);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.u32 = idx;
    ::epoll_ctl(epfd, EPOLL_CTL_ADD, c.fd, &ev);
    c.stage = Stage::connecting;
    if (rc == 0) connected(c);
  }

  void connected(StormClient& c) {
    c.out.clear();
    c.out_off = 0;
    put_validate(c.out);
    proto::Writer w(c.out);
    if (!c.added) {
      w.op(kV2, proto::Op::add).bytes(s->count_key).value<std::int64_t>(1);
      c.stage = Stage::adding;
    } else {
      w.op(kV2, proto::Op::wait).value<std::uint64_t>(1).bytes(s->done_key);
      c.stage = Stage::waiting;
    }
    if (flush(c.fd, c.out, c.out_off) == Flush::error) reset(c);
  }

  // The connection broke before the barrier finished: reconnect and resume.
  void reset(StormClient& c) {
    ++resets;
    retry_later(c);
  }

  void on_event(std::uint32_t idx, std::uint32_t events) {
    StormClient& c = clients[idx];
    if (c.stage == Stage::connecting) {
      if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return transient(err) ? retry_later(c) : give_up(c);
      connected(c);
      if (c.stage == Stage::backoff) return;
    }
    if (c.stage != Stage::adding && c.stage != Stage::waiting) return;
    if (events & EPOLLOUT && c.out_off < c.out.size()) {
      if (flush(c.fd, c.out, c.out_off) == Flush::error) return reset(c);
    }
    if (!(events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP))) return;
    bool open = drain(c.fd, c.in);
    if (c.stage == Stage::adding && c.in.size() >= 8) {
      auto v = load_le<std::int64_t>(c.in.data());
      c.in.erase(0, 8);
      c.added = true;
      c.out.clear();
      c.out_off = 0;
      proto::Writer w(c.out);
      // >= rather than ==: a reconnect after a lost reply may have counted a client twice.
      if (v >= s->clients) w.op(kV2, proto::Op::set).bytes(s->done_key).bytes("x");
      w.op(kV2, proto::Op::wait).value<std::uint64_t>(1).bytes(s->done_key);
      c.stage = Stage::waiting;
      if (flush(c.fd, c.out, c.out_off) == Flush::error) return reset(c);
    }
    if (c.stage == Stage::waiting && !c.in.empty()) {
      if (c.in[0] != static_cast<char>(proto::kStopWaiting) || c.in.size() != 1) ++errors;
      c.stage = Stage::done;
      last_done = std::max(last_done, now_ns());
      ++done;
      ++finished;
      return;  // stays connected until the storm is over, like a rank after init
    }
    if (!open) reset(c);
  }

  void run() {
    epfd = ::epoll_create1(EPOLL_CLOEXEC);
    for (std::uint32_t i = 0; i < clients.size(); ++i) start(i);
    std::vector<epoll_event> evs(1024);
    while (finished < clients.size()) {
      std::uint64_t t = now_ns();
      if (t >= s->deadline) break;
      std::uint64_t next = s->deadline;
      for (std::uint32_t i = 0; i < clients.size(); ++i) {
        StormClient& c = clients[i];
        if (c.stage != Stage::backoff) continue;
        if (c.retry_at <= t) {
          start(i);
        } else {
          next = std::min(next, c.retry_at);
        }
      }
      int timeout =
          static_cast<int>(std::min<std::uint64_t>((next - std::min(next, t)) / kMs + 1, 20));
      int n = ::epoll_wait(epfd, evs.data(), static_cast<int>(evs.size()), timeout);
      for (int i = 0; i < n; ++i)
        on_event(evs[static_cast<std::size_t>(i)].data.u32,
                 evs[static_cast<std::size_t>(i)].events);
    }
  }

  void close_all() {
    for (auto& c : clients) close_fd(c);
    ::close(epfd);
  }
};
}  // namespace

int run_storm(const Endpoint& ep, int clients, int threads, double timeout_s) {
  std::random_device rd;
  std::uint64_t run = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ now_ns();
  char run_id[17];
  std::snprintf(run_id, sizeof(run_id), "%016llx", static_cast<unsigned long long>(run));
  StormShared s;
  s.ep = ep;
  s.clients = clients;
  s.count_key = std::string("storm/") + run_id + "/count";
  s.done_key = std::string("storm/") + run_id + "/done";

  std::vector<StormThread> ts(static_cast<std::size_t>(threads));
  for (std::size_t t = 0; t < ts.size(); ++t) {
    ts[t].s = &s;
    ts[t].rng.s = run + t;
    std::size_t lo = t * static_cast<std::size_t>(clients) / ts.size();
    std::size_t hi = (t + 1) * static_cast<std::size_t>(clients) / ts.size();
    ts[t].clients.resize(hi - lo);
  }
  s.t0 = now_ns();
  s.deadline = s.t0 + static_cast<std::uint64_t>(timeout_s * 1e9);
  std::vector<std::thread> workers;
  for (auto& t : ts) workers.emplace_back([&t] { t.run(); });
  for (auto& w : workers) w.join();
  for (auto& t : ts) t.close_all();

  std::uint64_t retries = 0, resets = 0, errors = 0, last = s.t0;
  std::size_t done = 0;
  for (auto& t : ts) {
    retries += t.retries;
    resets += t.resets;
    errors += t.errors;
    done += t.done;
    last = std::max(last, t.last_done);
  }
  bool complete = done == static_cast<std::size_t>(clients);
  if (!complete) errors += static_cast<std::uint64_t>(clients) - done;
  double seconds = static_cast<double>((complete ? last : now_ns()) - s.t0) / 1e9;
  std::printf(
      "{\"mode\":\"storm\",\"clients\":%d,\"seconds\":%.4f,\"connect_retries\":%llu,"
      "\"resets\":%llu,\"errors\":%llu",
      clients, seconds, static_cast<unsigned long long>(retries),
      static_cast<unsigned long long>(resets), static_cast<unsigned long long>(errors));
  if (!complete) {
    std::printf(",\"error\":\"timed out after %.0f s: %zu of %d clients passed the barrier\"",
                timeout_s, done, clients);
  }
  std::printf("}\n");
  std::fflush(stdout);
  return complete && errors == 0 ? 0 : 1;
}

}  // namespace loadgen
