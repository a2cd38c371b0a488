// Reading and checking the worker environment (see env.hpp), and writing progress to the
// descriptor it may name, DDPRUN_PROGRESS_FD (see progress.hpp).
#include "ddp/worker/env.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <optional>
#include <utility>

#include "ddp/worker/progress.hpp"

#include "ddp/proto/error.hpp"
#include "ddp/proto/metric_name.hpp"
#include "ddp/proto/number.hpp"

namespace ddp::worker {
namespace {

using Env = std::map<std::string, std::string>;

std::optional<std::string> find(const Env& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

long long parse_int(const std::string& name, const std::string& text, long long lo, long long hi) {
  return ddp::parse_int(text, name, lo, hi);  // the one parser, its one message shape
}

int required_int(const Env& env, const std::string& name, long long lo, long long hi) {
  auto v = find(env, name);
  if (!v) {
    throw ConfigError(name +
                      " is not set (is this process started by ddprun, torchrun or srun with "
                      "the torchrun environment?)");
  }
  return static_cast<int>(parse_int(name, *v, lo, hi));
}

int optional_int(const Env& env, const std::string& name, int fallback, long long lo,
                 long long hi) {
  auto v = find(env, name);
  return v ? static_cast<int>(parse_int(name, *v, lo, hi)) : fallback;
}

void below(const char* a, int av, const char* b, int bv) {
  if (av >= bv) {
    throw ConfigError(std::string(a) + "=" + std::to_string(av) + " is not below " + b + "=" +
                      std::to_string(bv));
  }
}

}  // namespace

std::string WorkerEnv::store_prefix() const {
  return "/worker/attempt_" + std::to_string(restart_count);
}

WorkerEnv read_worker_env(const Env& env) {
  constexpr long long kMax = 1 << 30;
  WorkerEnv w;
  w.world_size = required_int(env, "WORLD_SIZE", 1, kMax);
  w.rank = required_int(env, "RANK", 0, kMax);
  below("RANK", w.rank, "WORLD_SIZE", w.world_size);
  w.local_world_size = optional_int(env, "LOCAL_WORLD_SIZE", w.world_size, 1, kMax);
  w.local_rank = optional_int(env, "LOCAL_RANK", w.rank % w.local_world_size, 0, kMax);
  below("LOCAL_RANK", w.local_rank, "LOCAL_WORLD_SIZE", w.local_world_size);
  if (w.local_world_size > w.world_size) {
    throw ConfigError("LOCAL_WORLD_SIZE=" + std::to_string(w.local_world_size) +
                      " exceeds WORLD_SIZE=" + std::to_string(w.world_size));
  }
  w.group_world_size = optional_int(env, "GROUP_WORLD_SIZE", 1, 1, kMax);
  w.group_rank = optional_int(env, "GROUP_RANK", 0, 0, kMax);
  below("GROUP_RANK", w.group_rank, "GROUP_WORLD_SIZE", w.group_world_size);
  w.role_world_size = optional_int(env, "ROLE_WORLD_SIZE", w.world_size, 1, kMax);
  w.role_rank = optional_int(env, "ROLE_RANK", w.rank, 0, kMax);
  below("ROLE_RANK", w.role_rank, "ROLE_WORLD_SIZE", w.role_world_size);
  if (auto v = find(env, "ROLE_NAME")) w.role_name = *v;

  auto addr = find(env, "MASTER_ADDR");
  if (!addr || addr->empty()) {
    throw ConfigError("MASTER_ADDR is not set: the address of the store (ddprun sets it)");
  }
  w.master_addr = *addr;
  auto port = find(env, "MASTER_PORT");
  if (!port) throw ConfigError("MASTER_PORT is not set: the port of the store (ddprun sets it)");
  try {
    w.master_port = static_cast<std::uint16_t>(parse_int("MASTER_PORT", *port, 1, 65535));
  } catch (const ConfigError&) {
    throw ConfigError("MASTER_PORT='" + *port + "' is not a port (1..65535)");
  }

  w.restart_count = optional_int(env, "TORCHELASTIC_RESTART_COUNT", 0, 0, kMax);
  w.max_restarts = optional_int(env, "TORCHELASTIC_MAX_RESTARTS", 0, 0, kMax);
  if (auto v = find(env, "TORCHELASTIC_RUN_ID")) w.run_id = *v;
  if (auto v = find(env, "TORCHELASTIC_USE_AGENT_STORE")) w.use_agent_store = *v == "True";
  if (auto v = find(env, "TORCHELASTIC_ERROR_FILE")) w.error_file = *v;
  return w;
}

// ------------------------------------------------------------------------------- progress

namespace {

char* put_int(char* p, char* end, std::int64_t v) { return std::to_chars(p, end, v).ptr; }

}  // namespace

std::size_t format_progress_line(char* buf, std::int64_t step, std::string_view phase,
                                 std::int64_t unix_us, std::int64_t samples, std::int64_t total,
                                 const LineMetric* metrics, std::size_t n_metrics) {
  char* const end = buf + kProgressLineMax - 1;  // room for the newline
  constexpr std::string_view kStep = "step=", kPhase = " phase=", kT = " t=",
                             kSamples = " samples=", kTotal = " total=";
  char* p = std::copy(kStep.begin(), kStep.end(), buf);
  p = put_int(p, end, step);
  if (!phase.empty()) {
    p = std::copy(kPhase.begin(), kPhase.end(), p);
    const auto n = std::min<std::size_t>(phase.size(), 32);
    p = std::copy(phase.begin(), phase.begin() + static_cast<std::ptrdiff_t>(n), p);
  }
  if (unix_us >= 0) {
    p = std::copy(kT.begin(), kT.end(), p);
    p = put_int(p, end, unix_us / 1000000);
    *p++ = '.';
    const auto us = unix_us % 1000000;  // six digits, zero-padded
    for (std::int64_t d = 100000; d > 0; d /= 10) *p++ = static_cast<char>('0' + (us / d) % 10);
  }
  if (samples >= 0) {
    p = std::copy(kSamples.begin(), kSamples.end(), p);
    p = put_int(p, end, samples);
  }
  if (total >= 0) {
    p = std::copy(kTotal.begin(), kTotal.end(), p);
    p = put_int(p, end, total);
  }
  for (std::size_t i = 0; i < std::min(n_metrics, kLineMetrics); ++i) {
    const std::string_view name = metrics[i].name ? metrics[i].name : "";
    if (name.size() > 32 || !ddp::metric_name_ok(name) || !std::isfinite(metrics[i].value))
      continue;
    // " name=" and a double's shortest form (at most 24 bytes); a line with every field at its
    // widest has no room for all four, and drops those that do not fit.
    if (end - p < static_cast<std::ptrdiff_t>(name.size() + 26)) break;
    *p++ = ' ';
    p = std::copy(name.begin(), name.end(), p);
    *p++ = '=';
    p = std::to_chars(p, end, metrics[i].value).ptr;
  }
  *p++ = '\n';
  return static_cast<std::size_t>(p - buf);
}

std::optional<int> parse_progress_fd(std::string_view text, std::string* why,
                                     std::string_view name) {
  try {
    const auto fd = ddp::parse_int(text, name, 0, 1 << 30);
    if (fd <= 2) {
      *why = std::string(name) + "=" + std::to_string(fd) +
             " is a standard stream (0-2), not a pipe of the agent's";
      return std::nullopt;
    }
    return static_cast<int>(fd);
  } catch (const ConfigError& e) {
    *why = e.what();
    return std::nullopt;
  }
}

ProgressWriter ProgressWriter::open(int fd, std::string* why) {
  ProgressWriter w;
  const int flags = ::fcntl(fd, F_GETFL);
  const std::string name = "DDPRUN_PROGRESS_FD=" + std::to_string(fd);
  if (flags < 0) {
    *why = name + " is not an open descriptor in this process";
    return w;
  }
  if ((flags & O_ACCMODE) == O_RDONLY) {
    *why = name + " is not open for writing";
    return w;
  }
  // A blocking descriptor could stall training when the agent falls behind.
  if ((flags & O_NONBLOCK) == 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    *why = name + ": cannot make it non-blocking";
    return w;
  }
  w.fd_ = fd;
  return w;
}

ProgressWriter ProgressWriter::from_env(const std::optional<std::string>& text, std::string* why) {
  if (!text) return {};
  const auto fd = parse_progress_fd(*text, why);
  return fd ? open(*fd, why) : ProgressWriter{};
}

void ProgressWriter::report(std::int64_t step, std::string_view phase,
                            std::int64_t samples) noexcept {
  if (fd_ < 0) return;
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  char line[kProgressLineMax];
  const std::int64_t unix_us = std::int64_t{ts.tv_sec} * 1000000 + ts.tv_nsec / 1000;
  const std::size_t n =
      format_progress_line(line, step, phase, unix_us, samples, total_, pending_, n_pending_);
  n_pending_ = 0;
  const ssize_t r = ::write(fd_, line, n);
  if (r == static_cast<ssize_t>(n)) {
    ++written_;
  } else if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
    ++dropped_;  // the agent is behind: the next line carries the step again
  } else {
    fd_ = -1;  // EPIPE (the agent is gone), EBADF, or a short write: stop writing
  }
}

void ProgressWriter::metric(const char* name, double value) noexcept {
  for (std::size_t i = 0; i < n_pending_; ++i) {
    if (std::string_view(pending_[i].name) == name) {
      pending_[i].value = value;
      return;
    }
  }
  if (n_pending_ < kLineMetrics) pending_[n_pending_++] = {name, value};
}

void ProgressWriter::declare(std::string_view key_value) noexcept {
  if (fd_ < 0 || key_value.size() + 1 > kProgressLineMax) return;
  char line[kProgressLineMax];
  std::memcpy(line, key_value.data(), key_value.size());
  line[key_value.size()] = '\n';
  const auto n = key_value.size() + 1;
  if (::write(fd_, line, n) == static_cast<ssize_t>(n)) ++written_;
}

bool ProgressWriter::listen(int control_fd, std::string* why) {
  const int flags = ::fcntl(control_fd, F_GETFL);
  const std::string name = "DDPRUN_CONTROL_FD=" + std::to_string(control_fd);
  if (flags < 0 || (flags & O_ACCMODE) == O_WRONLY) {
    *why = name + " is not a descriptor open for reading in this process";
    return false;
  }
  if ((flags & O_NONBLOCK) == 0 && ::fcntl(control_fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    *why = name + ": cannot make it non-blocking";
    return false;
  }
  control_fd_ = control_fd;
  return true;
}

std::optional<std::string> ProgressWriter::take_line() {
  while (control_fd_ >= 0) {
    const auto nl = in_.find('\n');
    if (nl != std::string::npos) {
      std::string line = in_.substr(0, nl);
      in_.erase(0, nl + 1);
      if (!std::exchange(overlong_, false)) return line;
      continue;  // the tail of an overlong line
    }
    if (in_.size() > kControlLineMax) {
      in_.clear();
      overlong_ = true;
    }
    char buf[512];
    const ssize_t n = ::read(control_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return std::nullopt;  // nothing waiting
    if (n <= 0) {  // EOF (the agent is gone) or an error: no more lines
      control_fd_ = -1;
      return std::nullopt;
    }
    in_.append(buf, static_cast<std::size_t>(n));
  }
  return std::nullopt;
}

}  // namespace ddp::worker
