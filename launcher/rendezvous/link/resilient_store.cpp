// The reconnecting store of resilient_store.hpp: each request runs on the current connection;
// a connection that fails is dropped, the outage reported, and the request repeated on a new
// one after the backoff's pause, within the agent's grace.
#include "ddp/launch/resilient_store.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <type_traits>

#include "ddp/proto/error.hpp"

namespace ddp::launch {

Dial dialer(std::string host, std::uint16_t port, rdzv::ClientOptions base) {
  return [host = std::move(host), port, base](bool again) {
    rdzv::ClientOptions o = base;
    if (again) o.connect_timeout = std::min(o.connect_timeout, std::chrono::milliseconds(1000));
    return std::make_unique<rdzv::StoreClient>(host, port, o);
  };
}

StoreLink tcp_link(std::unique_ptr<rdzv::StoreClient> client) {
  if (!client) return {};
  rdzv::StoreClient* c = client.get();
  return {std::move(client), [c] { c->interrupt(); }};
}

LinkDial tcp_links(Dial dial) {
  return [dial = std::move(dial)](bool again) { return tcp_link(dial(again)); };
}

ResilientStore::ResilientStore(Setup setup, StoreLink first)
    : s_(std::move(setup)), jitter_(s_.seed) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw IoError(std::string("eventfd failed: ") + std::strerror(errno));
  // Without a first connection, the first request connects (a store away then is an outage).
  client_ = std::move(first.store);
  interrupt_client_ = std::move(first.interrupt);
}

ResilientStore::~ResilientStore() {
  if (lost_since_ != OutageClock::time_point{} && s_.report) {
    s_.monitor->forget(s_.who, OutageClock::now());
  }
  ::close(wake_fd_);
}

void ResilientStore::interrupt() {
  interrupted_ = true;
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  std::lock_guard<std::mutex> g(mu_);
  if (client_ && interrupt_client_) interrupt_client_();
}

std::shared_ptr<rdzv::Store> ResilientStore::current() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (client_) return client_;
  }
  if (s_.impatient && OutageClock::now() < retry_after_) {
    throw IoError("store " + s_.monitor->where() + ": away; reconnecting later");
  }
  StoreLink fresh = s_.connect(true);
  std::lock_guard<std::mutex> g(mu_);
  client_ = std::move(fresh.store);
  interrupt_client_ = std::move(fresh.interrupt);
  if (interrupted_ && interrupt_client_) interrupt_client_();
  return client_;
}

// Waits `d` unless interrupted or a stop signal comes (IoError either way).
void ResilientStore::pause(std::chrono::milliseconds d) {
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {s_.cancel_fd, POLLIN, 0}};
  const auto until = std::chrono::steady_clock::now() + d;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    const int r = ::poll(fds, s_.cancel_fd >= 0 ? 2 : 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r > 0 && fds[0].revents != 0)
      throw IoError("store " + s_.monitor->where() + ": interrupted");
    if (r > 0 && fds[1].revents != 0) {
      throw IoError("stopped waiting for the store at " + s_.monitor->where() +
                    ": a stop signal came");
    }
  }
}

// A failed request: the connection goes, the outage is counted, and (unless the store has been
// away longer than the grace, or nobody is to wait) the caller pauses and tries again.
void ResilientStore::failed(const std::string& error, OutageClock::time_point now) {
  if (lost_since_ == OutageClock::time_point{}) lost_since_ = now;
  if (s_.report) s_.monitor->lost(s_.who, error, now);
  const auto lasted = now - lost_since_;
  const auto delay = s_.backoff.delay(attempt_++, jitter_.next());
  if (s_.impatient) {
    retry_after_ = now + delay;
    throw IoError(error);
  }
  if (!patient_ || lasted >= s_.monitor->grace()) {
    throw IoError(
        s_.monitor->give_up_message(std::chrono::duration<double>(lasted).count(), error));
  }
  pause(delay);
}

// A connection that failed is first replaced at once, without counting an outage: it may have
// died in an outage that is over (an idle connection learns of it only when used).
template <typename F>
auto ResilientStore::run(F&& op) -> decltype(op(std::declval<rdzv::Store&>())) {
  bool replaced = false;
  std::string first_error;  // what the failed connection said (the retry's may differ)
  while (true) {
    std::shared_ptr<rdzv::Store> c;
    try {
      c = current();
      if (replaced && s_.on_reconnect) s_.on_reconnect(*c);
      auto done = [&] {
        if (lost_since_ == OutageClock::time_point{}) return;
        lost_since_ = {};
        attempt_ = 0;
        if (s_.report) s_.monitor->back(s_.who, OutageClock::now());
      };
      // A new connection's handshake (and the republishing) was answered: the store is back,
      // even if the request repeated now is a WAIT that blocks for a while.
      if (replaced) done();
      try {
        if constexpr (std::is_void_v<decltype(op(*c))>) {
          op(*c);
          done();
          return;
        } else {
          auto r = op(*c);
          done();
          return r;
        }
      } catch (const TimeoutError&) {
        done();  // a WAIT that timed out was answered: the store is there
        throw;
      }
    } catch (const IoError& e) {
      if (interrupted_) throw;
      {
        std::lock_guard<std::mutex> g(mu_);
        if (client_ == c) {
          client_.reset();
          interrupt_client_ = nullptr;
        }
      }
      c.reset();  // closes the connection
      if (!replaced && lost_since_ == OutageClock::time_point{} && !s_.impatient) {
        replaced = true;
        first_error = e.what();
        continue;
      }
      replaced = true;
      failed(first_error.empty() ? e.what() : first_error, OutageClock::now());
      first_error.clear();
    }
  }
}

void ResilientStore::set(std::string_view key, std::string_view value) {
  run([&](rdzv::Store& c) { c.set(key, value); });
}
std::string ResilientStore::get(std::string_view key) {
  return run([&](rdzv::Store& c) { return c.get(key); });
}
std::int64_t ResilientStore::add(std::string_view key, std::int64_t delta) {
  return run([&](rdzv::Store& c) { return c.add(key, delta); });
}
std::string ResilientStore::compare_set(std::string_view key, std::string_view expected,
                                        std::string_view desired) {
  return run([&](rdzv::Store& c) { return c.compare_set(key, expected, desired); });
}
bool ResilientStore::check(const std::vector<std::string>& keys) {
  return run([&](rdzv::Store& c) { return c.check(keys); });
}
void ResilientStore::wait(const std::vector<std::string>& keys) {
  run([&](rdzv::Store& c) { c.wait(keys); });
}
// A wait repeated after a reconnection waits only for what is left of its timeout.
void ResilientStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  run([&](rdzv::Store& c) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    c.wait(keys, std::max(left, std::chrono::milliseconds(1)));
  });
}
bool ResilientStore::delete_key(std::string_view key) {
  return run([&](rdzv::Store& c) { return c.delete_key(key); });
}
std::int64_t ResilientStore::num_keys() {
  return run([&](rdzv::Store& c) { return c.num_keys(); });
}
void ResilientStore::append(std::string_view key, std::string_view value) {
  run([&](rdzv::Store& c) { c.append(key, value); });
}
std::vector<std::string> ResilientStore::multi_get(const std::vector<std::string>& keys) {
  return run([&](rdzv::Store& c) { return c.multi_get(keys); });
}
void ResilientStore::multi_set(const std::vector<std::string>& keys,
                               const std::vector<std::string>& values) {
  run([&](rdzv::Store& c) { c.multi_set(keys, values); });
}
std::vector<std::string> ResilientStore::list_keys() {
  return run([&](rdzv::Store& c) { return c.list_keys(); });
}
// Repeated after a reconnection: the rest of its timeout; a create that was applied but whose
// reply was lost finds `key` holding `desired` and writes `keys` again (the same values).
std::string ResilientStore::wait_get(std::string_view key, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  return run([&](rdzv::Store& c) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    return c.wait_get(key, std::max(left, std::chrono::milliseconds(1)));
  });
}
std::string ResilientStore::create_with(std::string_view key, std::string_view desired,
                                        const std::vector<std::string>& keys,
                                        const std::vector<std::string>& values) {
  return run([&](rdzv::Store& c) { return c.create_with(key, desired, keys, values); });
}

}  // namespace ddp::launch
