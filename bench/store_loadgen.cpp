// store_loadgen: drives a c10d TCPStore server (ddprund or torch's own) over the raw torch 2.x
// wire protocol, so one binary measures both. --mode mix: closed-loop SET/GET/ADD/WAIT traffic
// from C connections on T epoll threads -> one JSON line with throughput and latency.
// --mode storm: N clients connect at once and do init_process_group's ADD + WAIT barrier -> one
// JSON line with the wall time.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ddp/proto/opcodes.hpp"
#include "ddp/proto/writer.hpp"
#include "ddp/rdzv/fd_limit.hpp"

namespace {

namespace proto = ddp::proto;
using Clock = std::chrono::steady_clock;
constexpr proto::Dialect kV2 = proto::Dialect::v2;
constexpr std::uint64_t kMs = 1'000'000;
constexpr std::size_t kMaxReplyBytes = 64u << 20;  // a GET length beyond this is a desync

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count());
}

// splitmix64: small, seedable, good enough to pick ops and keys.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t below(std::uint64_t n) { return next() % n; }
};

// Log-linear latency histogram (ns): 64 sub-buckets per power of two, <= 1.6 % error.
class Histogram {
 public:
  void record(std::uint64_t v) {
    ++buckets_[index(v)];
    ++count_;
  }
  void merge(const Histogram& o) {
    for (std::size_t i = 0; i < kBuckets; ++i) buckets_[i] += o.buckets_[i];
    count_ += o.count_;
  }
  std::uint64_t count() const { return count_; }
  double percentile_us(double p) const {
    if (count_ == 0) return 0.0;
    auto target = static_cast<std::uint64_t>(std::ceil(p * static_cast<double>(count_)));
    target = std::max<std::uint64_t>(target, 1);
    std::uint64_t seen = 0;
    for (std::size_t i = 0; i < kBuckets; ++i) {
      seen += buckets_[i];
      if (seen >= target) return midpoint(i) / 1000.0;
    }
    return midpoint(kBuckets - 1) / 1000.0;
  }

 private:
  static constexpr std::size_t kSub = 64;
  static constexpr std::size_t kBuckets = (63 - 5) * kSub + kSub;
  static std::size_t index(std::uint64_t v) {
    if (v < kSub) return static_cast<std::size_t>(v);
    auto e = static_cast<unsigned>(63 - std::countl_zero(v));  // >= 6
    auto sub = static_cast<std::size_t>((v >> (e - 6)) & (kSub - 1));
    return (e - 5) * kSub + sub;
  }
  static double midpoint(std::size_t idx) {
    if (idx < kSub) return static_cast<double>(idx);
    std::size_t e = idx / kSub + 5;
    double lower = static_cast<double>((kSub + idx % kSub) << (e - 6));
    return lower + static_cast<double>(std::uint64_t{1} << (e - 6)) / 2.0;
  }
  std::vector<std::uint64_t> buckets_ = std::vector<std::uint64_t>(kBuckets, 0);
  std::uint64_t count_ = 0;
};

// ---------------------------------------------------------------- sockets

struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
};

Endpoint resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res); rc != 0 || !res) {
    throw std::runtime_error("cannot resolve " + host + ": " + ::gai_strerror(rc));
  }
  Endpoint ep;
  std::memcpy(&ep.addr, res->ai_addr, res->ai_addrlen);
  ep.len = res->ai_addrlen;
  ep.family = res->ai_family;
  ::freeaddrinfo(res);
  return ep;
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Blocking connect, retried for up to 10 s while the server's backlog refuses us.
int connect_blocking(const Endpoint& ep) {
  std::uint64_t deadline = now_ns() + 10'000 * kMs;
  for (;;) {
    int fd = ::socket(ep.family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&ep.addr), ep.len) == 0) {
      set_nodelay(fd);
      return fd;
    }
    int err = errno;
    ::close(fd);
    if (now_ns() > deadline || (err != ECONNREFUSED && err != ECONNRESET && err != EAGAIN &&
                                err != ETIMEDOUT && err != EINTR && err != EADDRNOTAVAIL)) {
      throw std::runtime_error(std::string("connect: ") + std::strerror(err));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(std::string("send: ") + std::strerror(errno));
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

void recv_exact(int fd, char* buf, std::size_t len) {
  while (len > 0) {
    ssize_t n = ::recv(fd, buf, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("connection closed during setup");
    buf += n;
    len -= static_cast<std::size_t>(n);
  }
}

void put_validate(std::string& out) {
  proto::Writer(out).op(kV2, proto::Op::validate).value<std::uint32_t>(proto::kValidateMagic);
}

enum class Flush { done, blocked, error };

Flush flush(int fd, const std::string& out, std::size_t& off) {
  while (off < out.size()) {
    ssize_t n = ::send(fd, out.data() + off, out.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return Flush::blocked;
    } else {
      return Flush::error;
    }
  }
  return Flush::done;
}

// Reads everything available into `in`; false on EOF or a hard error.
bool drain(int fd, std::string& in) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      in.append(buf, static_cast<std::size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return true;
    } else {
      return false;
    }
  }
}

template <typename T>
T load_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// ---------------------------------------------------------------- mix mode

struct MixConfig {
  Endpoint ep;
  int connections = 1;
  int threads = 1;
  double duration_s = 5;
  double warmup_s = 1;
  std::string mix = "set=40,get=40,add=15,wait=5";
  std::uint64_t keys = 1024;
  std::size_t value_bytes = 64;
  std::uint64_t seed = 1;
  int server_pid = 0;  // when set, the server's CPU time over the window is reported too
};

// CPU seconds (user + system) used so far by this process, or by `pid` when it is not 0.
double cpu_seconds(int pid) {
  if (pid == 0) {
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  }
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return -1;
  char buf[1024];
  std::size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  const char* p = std::strrchr(buf, ')');  // the command name may hold spaces
  unsigned long long utime = 0, stime = 0;
  if (!p || std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                        &stime) != 2) {
    return -1;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

void sleep_until_ns(std::uint64_t t) {
  std::uint64_t now = now_ns();
  if (t > now) std::this_thread::sleep_for(std::chrono::nanoseconds(t - now));
}

enum class Kind : std::uint8_t { none, set, get, add, wait };

struct Shared {
  std::vector<std::string> keys;      // bench/k<i>
  std::vector<std::string> counters;  // bench/ctr<i>
  std::string value;
  std::array<std::uint64_t, 4> cumulative{};  // set, get, add, wait
  std::uint64_t window_start = 0, window_end = 0;
};

struct MixConn {
  int fd = -1;
  bool alive = true;
  Rng rng{0};
  std::string out, in;
  std::size_t out_off = 0, in_off = 0;
  Kind pending = Kind::none;  // the reply awaited (set: the request is still being written)
  std::uint64_t started = 0;
  std::size_t counter = 0;
  std::array<std::int64_t, 64> last_counter{};
};

struct MixThread {
  const Shared* shared = nullptr;
  std::size_t value_bytes = 0;
  std::vector<MixConn> conns;
  Histogram hist;
  std::uint64_t ops = 0, errors = 0;
  std::size_t alive = 0;
  int epfd = -1;
  std::vector<std::uint32_t> ready;

  void fail(MixConn& c) {
    if (!c.alive) return;
    ++errors;
    c.alive = false;
    --alive;
    ::epoll_ctl(epfd, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
  }

  void complete(MixConn& c) {
    std::uint64_t t = now_ns();
    if (t >= shared->window_start && t < shared->window_end) {
      hist.record(t - c.started);
      ++ops;
    }
    c.pending = Kind::none;
  }

  // Issues requests until one needs a reply or a write blocks. A run of SETs (no reply) is cut
  // after 32 so that one connection cannot starve the others; it resumes from `ready`.
  void issue(std::uint32_t idx) {
    MixConn& c = conns[idx];
    const Shared& s = *shared;
    for (int streak = 0; c.alive; ++streak) {
      if (streak == 32) {
        ready.push_back(idx);
        return;
      }
      c.out.clear();
      c.out_off = 0;
      proto::Writer w(c.out);
      std::uint64_t pick = c.rng.below(s.cumulative[3]);
      std::uint64_t key = c.rng.below(s.keys.size());
      if (pick < s.cumulative[0]) {
        w.op(kV2, proto::Op::set).bytes(s.keys[key]).bytes(s.value);
        c.pending = Kind::set;
      } else if (pick < s.cumulative[1]) {
        w.op(kV2, proto::Op::get).bytes(s.keys[key]);
        c.pending = Kind::get;
      } else if (pick < s.cumulative[2]) {
        c.counter = static_cast<std::size_t>(key % 64);
        w.op(kV2, proto::Op::add).bytes(s.counters[c.counter]).value<std::int64_t>(1);
        c.pending = Kind::add;
      } else {
        w.op(kV2, proto::Op::wait).value<std::uint64_t>(1).bytes(s.keys[key]);
        c.pending = Kind::wait;
      }
      c.started = now_ns();
      Flush f = flush(c.fd, c.out, c.out_off);
      if (f == Flush::error) return fail(c);
      if (f == Flush::blocked || c.pending != Kind::set) return;
      complete(c);  // SET has no reply: done once written, as for a torch client
    }
  }

  // Consumes complete replies from c.in; false when the stream is out of step.
  bool parse(std::uint32_t idx) {
    MixConn& c = conns[idx];
    for (;;) {
      std::size_t avail = c.in.size() - c.in_off;
      if (avail == 0) break;
      const char* p = c.in.data() + c.in_off;
      if (c.pending == Kind::get) {
        if (avail < 8) break;
        auto len = load_le<std::uint64_t>(p);
        if (len > kMaxReplyBytes) return false;
        if (avail < 8 + len) break;
        if (len != value_bytes) ++errors;
        c.in_off += 8 + len;
      } else if (c.pending == Kind::add) {
        if (avail < 8) break;
        auto v = load_le<std::int64_t>(p);
        if (v <= c.last_counter[c.counter]) ++errors;
        c.last_counter[c.counter] = v;
        c.in_off += 8;
      } else if (c.pending == Kind::wait) {
        if (p[0] != static_cast<char>(proto::kStopWaiting)) ++errors;
        c.in_off += 1;
      } else {
        return false;  // bytes nobody asked for
      }
      complete(c);
      issue(idx);
      if (!c.alive) return true;
    }
    if (c.in_off == c.in.size()) {
      c.in.clear();
      c.in_off = 0;
    }
    return true;
  }

  void on_event(std::uint32_t idx, std::uint32_t events) {
    MixConn& c = conns[idx];
    if (!c.alive) return;
    if (events & EPOLLOUT && c.out_off < c.out.size()) {
      Flush f = flush(c.fd, c.out, c.out_off);
      if (f == Flush::error) return fail(c);
      if (f == Flush::done && c.pending == Kind::set) {
        complete(c);
        issue(idx);
        if (!c.alive) return;
      }
    }
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
      bool open = drain(c.fd, c.in);
      if (!parse(idx)) return fail(c);
      if (!open && c.alive) fail(c);
    }
  }

  void run() {
    epfd = ::epoll_create1(EPOLL_CLOEXEC);
    alive = conns.size();
    for (std::uint32_t i = 0; i < conns.size(); ++i) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
      ev.data.u32 = i;
      ::epoll_ctl(epfd, EPOLL_CTL_ADD, conns[i].fd, &ev);
    }
    for (std::uint32_t i = 0; i < conns.size(); ++i) issue(i);
    std::vector<epoll_event> evs(std::max<std::size_t>(conns.size(), 1));
    std::vector<std::uint32_t> resume;
    while (alive > 0) {
      std::uint64_t t = now_ns();
      if (t >= shared->window_end) break;
      int timeout =
          ready.empty()
              ? static_cast<int>(std::min<std::uint64_t>((shared->window_end - t) / kMs + 1, 50))
              : 0;
      int n = ::epoll_wait(epfd, evs.data(), static_cast<int>(evs.size()), timeout);
      for (int i = 0; i < n; ++i)
        on_event(evs[static_cast<std::size_t>(i)].data.u32,
                 evs[static_cast<std::size_t>(i)].events);
      resume.swap(ready);
      ready.clear();
      for (std::uint32_t idx : resume) {
        if (conns[idx].alive && conns[idx].pending == Kind::none) issue(idx);
      }
      resume.clear();
    }
    for (auto& c : conns) {
      if (c.alive) ::close(c.fd);
    }
    ::close(epfd);
  }
};

std::array<std::uint64_t, 4> parse_mix(const std::string& spec) {
  std::array<std::uint64_t, 4> w{};
  const char* names[] = {"set", "get", "add", "wait"};
  std::size_t pos = 0;
  while (pos < spec.size()) {
    std::size_t comma = spec.find(',', pos);
    std::string item =
        spec.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    pos = comma == std::string::npos ? spec.size() : comma + 1;
    std::size_t eq = item.find('=');
    if (eq == std::string::npos) throw std::runtime_error("bad --mix item: " + item);
    std::string name = item.substr(0, eq);
    auto it = std::find(std::begin(names), std::end(names), name);
    if (it == std::end(names)) throw std::runtime_error("unknown op in --mix: " + name);
    w[static_cast<std::size_t>(it - std::begin(names))] = std::stoull(item.substr(eq + 1));
  }
  for (std::size_t i = 1; i < 4; ++i) w[i] += w[i - 1];
  if (w[3] == 0) throw std::runtime_error("--mix has no weight");
  return w;
}

int run_mix(const MixConfig& cfg) {
  Shared s;
  s.cumulative = parse_mix(cfg.mix);
  for (std::uint64_t i = 0; i < cfg.keys; ++i) s.keys.push_back("bench/k" + std::to_string(i));
  for (int i = 0; i < 64; ++i) s.counters.push_back("bench/ctr" + std::to_string(i));
  s.value.assign(cfg.value_bytes, 'v');

  // Pre-populate every key, then one GET round trip proves the SETs were applied.
  {
    int fd = connect_blocking(cfg.ep);
    std::string out;
    put_validate(out);
    proto::Writer w(out);
    for (const auto& k : s.keys) w.op(kV2, proto::Op::set).bytes(k).bytes(s.value);
    w.op(kV2, proto::Op::get).bytes(s.keys.back());
    send_all(fd, out);
    std::string reply(8 + cfg.value_bytes, '\0');
    recv_exact(fd, reply.data(), reply.size());
    if (load_le<std::uint64_t>(reply.data()) != cfg.value_bytes) {
      throw std::runtime_error("pre-populated key reads back with the wrong length");
    }
    ::close(fd);
  }

  std::vector<MixThread> threads(static_cast<std::size_t>(cfg.threads));
  for (auto& t : threads) {
    t.shared = &s;
    t.value_bytes = cfg.value_bytes;
  }
  for (int i = 0; i < cfg.connections; ++i) {
    int fd = connect_blocking(cfg.ep);
    std::string v;
    put_validate(v);
    send_all(fd, v);
    set_nonblocking(fd);
    MixConn c;
    c.fd = fd;
    c.rng.s = cfg.seed * 0x100000001B3ull + static_cast<std::uint64_t>(i);
    threads[static_cast<std::size_t>(i % cfg.threads)].conns.push_back(std::move(c));
  }

  s.window_start = now_ns() + static_cast<std::uint64_t>(cfg.warmup_s * 1e9);
  s.window_end = s.window_start + static_cast<std::uint64_t>(cfg.duration_s * 1e9);
  std::vector<std::thread> workers;
  for (auto& t : threads) workers.emplace_back([&t] { t.run(); });
  // CPU used over exactly the measured window, by this load generator and by the server.
  sleep_until_ns(s.window_start);
  double self0 = cpu_seconds(0), server0 = cfg.server_pid ? cpu_seconds(cfg.server_pid) : -1;
  sleep_until_ns(s.window_end);
  double self1 = cpu_seconds(0), server1 = cfg.server_pid ? cpu_seconds(cfg.server_pid) : -1;
  for (auto& w : workers) w.join();

  Histogram all;
  std::uint64_t ops = 0, errors = 0;
  for (auto& t : threads) {
    all.merge(t.hist);
    ops += t.ops;
    errors += t.errors;
  }
  std::printf(
      "{\"mode\":\"mix\",\"connections\":%d,\"threads\":%d,\"duration_s\":%.3f,\"ops\":%llu,"
      "\"ops_per_s\":%.1f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"errors\":%llu,"
      "\"loadgen_cpu_us_per_op\":%.2f,\"server_cpu_us_per_op\":%.2f}\n",
      cfg.connections, cfg.threads, cfg.duration_s, static_cast<unsigned long long>(ops),
      static_cast<double>(ops) / cfg.duration_s, all.percentile_us(0.50), all.percentile_us(0.99),
      static_cast<unsigned long long>(errors),
      ops ? (self1 - self0) * 1e6 / static_cast<double>(ops) : 0.0,
      ops && server0 >= 0 && server1 >= 0 ? (server1 - server0) * 1e6 / static_cast<double>(ops)
                                          : -1.0);
  std::fflush(stdout);
  return errors == 0 ? 0 : 1;
}

// ---------------------------------------------------------------- storm mode

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

}  // namespace

int main(int argc, char** argv) {
  std::string mode, host = "127.0.0.1";
  int port = 0, clients = 1024;
  double timeout_s = 30;
  MixConfig cfg;
  CLI::App app{"store_loadgen: load generator for c10d TCPStore servers (torch 2.x wire)"};
  app.add_option("--mode", mode, "mix | storm")->required()->check(CLI::IsMember({"mix", "storm"}));
  app.add_option("--host", host, "server address")->capture_default_str();
  app.add_option("--port", port, "server port")->required()->check(CLI::Range(1, 65535));
  app.add_option("--threads", cfg.threads, "client threads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--connections", cfg.connections, "mix: connections")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--duration-s", cfg.duration_s, "mix: measured seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup-s", cfg.warmup_s, "mix: seconds before measuring")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mix", cfg.mix, "mix: op weights")->capture_default_str();
  app.add_option("--keys", cfg.keys, "mix: key space")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--value-bytes", cfg.value_bytes, "mix: value size")->capture_default_str();
  app.add_option("--seed", cfg.seed, "mix: PRNG seed")->capture_default_str();
  app.add_option("--server-pid", cfg.server_pid,
                 "mix: also report this process's CPU time per op (read from /proc)");
  app.add_option("--clients", clients, "storm: clients")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--timeout-s", timeout_s, "storm: give up after this long")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::signal(SIGPIPE, SIG_IGN);
  ddp::rdzv::raise_fd_limit();
  try {
    cfg.ep = resolve(host, port);
    if (mode == "mix") return run_mix(cfg);
    return run_storm(cfg.ep, clients, cfg.threads, timeout_s);
  } catch (const std::exception& e) {
    std::printf("{\"mode\":\"%s\",\"error\":\"%s\",\"errors\":1}\n", mode.c_str(), e.what());
    return 1;
  }
}
