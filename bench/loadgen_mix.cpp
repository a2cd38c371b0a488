// loadgen_mix: store_loadgen --mode mix: closed-loop SET/GET/ADD/WAIT traffic from C
// connections on T epoll threads -> one JSON line with throughput and latency.
#include <sys/epoll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ddp/proto/writer.hpp"
#include "loadgen_modes.hpp"
#include "loadgen_wire.hpp"

namespace loadgen {
namespace {

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

}  // namespace

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

}  // namespace loadgen
