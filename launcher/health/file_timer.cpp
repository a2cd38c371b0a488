// torch's elastic file timer served by the agent (see file_timer.hpp): the request parser, the
// table of live timers, and the FIFO the workers' FileTimerClient writes into. Behaviour follows
// torch 2.15's FileTimerServer (file_based_local_timer.py), except that the FIFO is read from
// the agent's event loop (non-blocking, with a writer fd of our own so poll() never reports a
// hang-up) instead of a thread that sleeps 0.1 s between reads.
#include "ddp/launch/file_timer.hpp"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <random>

#include <nlohmann/json.hpp>

#include "ddp/launch/uuid.hpp"
#include "ddp/proto/error.hpp"

namespace ddp::launch {

namespace {

using nlohmann::json;

// A JSON integer that fits an int (bools and floats are not integers to nlohmann either).
std::optional<int> as_int(const json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(INT_MAX)) return std::nullopt;
    return static_cast<int>(u);
  }
  if (!v.is_number_integer()) return std::nullopt;
  const auto i = v.get<std::int64_t>();
  if (i < INT_MIN || i > INT_MAX) return std::nullopt;
  return static_cast<int>(i);
}

std::string errno_text(const std::string& what, const std::string& path, int err) {
  return what + " " + path + ": " + std::strerror(err);
}

// The line as quoted in an error: at most 200 bytes.
std::string quoted(std::string_view line) {
  std::string q(line.substr(0, 200));
  if (line.size() > 200) q += "...";
  return "'" + q + "'";
}

}  // namespace

std::optional<TimerRequest> parse_timer_request(std::string_view line, std::string* error) {
  auto fail = [&](const std::string& why) -> std::optional<TimerRequest> {
    if (error) *error = "file timer request " + quoted(line) + ": " + why;
    return std::nullopt;
  };
  json j;
  try {
    j = json::parse(line.begin(), line.end());
  } catch (const json::exception& e) {
    return fail(std::string("not JSON (") + e.what() + ")");
  }
  if (!j.is_object()) return fail("not a JSON object");
  // torch's server ignores "version"; its client always writes 1. Another number would be a
  // protocol we do not know, so it is refused rather than guessed at.
  if (auto v = j.find("version"); v != j.end() && as_int(*v) != 1) {
    return fail("version " + v->dump() + " is not 1");
  }
  TimerRequest r;
  auto pid = j.find("pid");
  if (pid == j.end()) return fail("no \"pid\"");
  const auto pid_value = as_int(*pid);
  if (!pid_value || *pid_value <= 0) {
    return fail("\"pid\" " + pid->dump() + " is not a process id (an integer > 0)");
  }
  r.pid = static_cast<pid_t>(*pid_value);
  auto scope = j.find("scope_id");
  if (scope == j.end()) return fail("no \"scope_id\"");
  if (!scope->is_string()) return fail("\"scope_id\" " + scope->dump() + " is not a string");
  r.scope_id = scope->get<std::string>();
  auto exp = j.find("expiration_time");
  if (exp == j.end()) return fail("no \"expiration_time\"");
  if (!exp->is_number() || !std::isfinite(exp->get<double>())) {
    return fail("\"expiration_time\" " + exp->dump() + " is not a number of seconds");
  }
  r.expiration_time = exp->get<double>();
  auto sig = j.find("signal");
  if (sig == j.end()) return fail("no \"signal\"");
  // <= 0 is valid: the timer expires without a signal (torch: "Do not reap it").
  const auto sig_value = as_int(*sig);
  if (!sig_value || *sig_value > SIGRTMAX) {
    return fail("\"signal\" " + sig->dump() +
                " is not a signal number (an integer <= " + std::to_string(SIGRTMAX) + ")");
  }
  r.signal = *sig_value;
  return r;
}

void TimerTable::apply(const TimerRequest& r) {
  auto key = std::make_pair(r.pid, r.scope_id);
  if (r.expiration_time < 0) {
    timers_.erase(key);  // release (of a timer that may not exist)
  } else {
    timers_.insert_or_assign(std::move(key), r);  // acquire, replacing the same scope's
  }
}

std::vector<TimerRequest> TimerTable::take_expired(double now) {
  std::vector<TimerRequest> out;
  for (auto it = timers_.begin(); it != timers_.end();) {
    if (it->second.expiration_time <= now) {
      out.push_back(std::move(it->second));
      it = timers_.erase(it);
    } else {
      ++it;
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const TimerRequest& a, const TimerRequest& b) {
    return a.expiration_time < b.expiration_time;  // map order already gives (pid, scope)
  });
  return out;
}

std::optional<double> TimerTable::next_deadline() const {
  std::optional<double> best;
  for (const auto& [key, r] : timers_) {
    if (!best || r.expiration_time < *best) best = r.expiration_time;
  }
  return best;
}

void TimerTable::forget_pid(pid_t pid) {
  auto it = timers_.lower_bound(std::make_pair(pid, std::string()));
  while (it != timers_.end() && it->first.first == pid) it = timers_.erase(it);
}

std::vector<pid_t> TimerTable::pids() const {
  std::vector<pid_t> out;
  for (const auto& [key, r] : timers_) {
    if (out.empty() || out.back() != key.first) out.push_back(key.first);
  }
  return out;
}

std::unique_ptr<FileTimerServer> FileTimerServer::from_env(
    const std::map<std::string, std::string>& env) {
  auto on = env.find("TORCHELASTIC_ENABLE_FILE_TIMER");
  if (on == env.end() || on->second != "1") return nullptr;
  std::string path;
  if (auto f = env.find("TORCHELASTIC_TIMER_FILE"); f != env.end()) {
    if (f->second.empty()) {
      throw ConfigError(
          "TORCHELASTIC_TIMER_FILE is set but empty: give the FIFO's path or unset it");
    }
    path = f->second;
  } else {
    std::string dir = "/tmp";
    if (auto t = env.find("TMPDIR"); t != env.end() && !t->second.empty()) dir = t->second;
    if (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    path = dir + "/watchdog_timer_" + random_uuid4();  // torch's name
  }
  return std::unique_ptr<FileTimerServer>(new FileTimerServer(std::move(path)));
}

FileTimerServer::FileTimerServer(std::string path) : path_(std::move(path)) {
  // As torch: whatever is at the path goes, then a fresh FIFO (0600: only this user's workers).
  if (::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    throw IoError(errno_text("file timer: cannot remove the old", path_, errno));
  }
  if (::mkfifo(path_.c_str(), 0600) != 0) {
    throw IoError(errno_text("file timer: cannot make the FIFO", path_, errno));
  }
  read_fd_ = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  // With a reader open, a blocking O_WRONLY open of a FIFO returns at once.
  if (read_fd_ >= 0) keep_fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  struct stat st {};
  if (read_fd_ < 0 || keep_fd_ < 0 || ::fstat(read_fd_, &st) != 0 || !S_ISFIFO(st.st_mode)) {
    const int err = errno;
    if (read_fd_ >= 0) ::close(read_fd_);
    if (keep_fd_ >= 0) ::close(keep_fd_);
    ::unlink(path_.c_str());
    throw IoError(errno_text("file timer: cannot open the FIFO", path_, err));
  }
  fifo_dev_ = st.st_dev;
  fifo_ino_ = st.st_ino;
  // Best effort: room for ~250 requests of 4 KiB while the event loop is busy.
  (void)::fcntl(read_fd_, F_SETPIPE_SZ, 1 << 20);
}

FileTimerServer::~FileTimerServer() {
  ::close(read_fd_);
  ::close(keep_fd_);
  // Only our FIFO: another agent may have replaced it at the same TORCHELASTIC_TIMER_FILE.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && st.st_dev == fifo_dev_ && st.st_ino == fifo_ino_) {
    ::unlink(path_.c_str());
  }
}

std::vector<TimerRequest> FileTimerServer::on_readable() {
  std::vector<TimerRequest> out;
  auto note = [&](std::string why) {
    if (errors_.size() < kMaxErrors) {
      errors_.push_back(std::move(why));
    } else {
      ++errors_dropped_;
    }
  };
  auto take_line = [&](std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) return;  // blank: nothing
    std::string why;
    if (auto r = parse_timer_request(line, &why)) {
      table_.apply(*r);
      out.push_back(std::move(*r));
    } else {
      note(std::move(why));
    }
  };
  char buf[16384];
  // At most 1 MiB per call, so writers that never stop cannot hold the event loop; poll() is
  // level-triggered and calls again.
  for (int round = 0; round < 64; ++round) {
    const ssize_t n = ::read(read_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EAGAIN: drained (never EOF: keep_fd_ is a writer)
    std::string_view chunk(buf, static_cast<std::size_t>(n));
    while (!chunk.empty()) {
      const auto nl = chunk.find('\n');
      const auto part = chunk.substr(0, nl);
      if (discarding_) {
        if (nl != std::string_view::npos) discarding_ = false;
      } else if (pending_.size() + part.size() > kMaxLineBytes) {
        note("file timer: dropped a line longer than " + std::to_string(kMaxLineBytes) +
             " bytes starting " + quoted(pending_.empty() ? part : std::string_view(pending_)));
        pending_.clear();
        discarding_ = nl == std::string_view::npos;
      } else if (nl == std::string_view::npos) {
        pending_.append(part);
      } else if (pending_.empty()) {
        take_line(part);
      } else {
        pending_.append(part);
        take_line(pending_);
        pending_.clear();
      }
      chunk = nl == std::string_view::npos ? std::string_view() : chunk.substr(nl + 1);
    }
    if (static_cast<std::size_t>(n) < sizeof buf) break;
  }
  return out;
}

int FileTimerServer::timeout_ms(double now) const {
  auto deadline = table_.next_deadline();
  if (!deadline) return -1;
  const double ms = std::ceil((*deadline - now) * 1000.0);
  if (ms <= 0) return 0;
  if (ms >= static_cast<double>(INT_MAX)) return INT_MAX;
  return static_cast<int>(ms);
}

void FileTimerServer::forget_dead_pids() {
  for (pid_t pid : table_.pids()) {
    if (::kill(pid, 0) != 0 && errno == ESRCH) table_.forget_pid(pid);
  }
}

std::vector<std::string> FileTimerServer::take_errors() {
  auto out = std::move(errors_);
  errors_.clear();
  if (errors_dropped_ > 0) {
    out.push_back("file timer: " + std::to_string(errors_dropped_) + " more bad lines");
    errors_dropped_ = 0;
  }
  return out;
}

}  // namespace ddp::launch
