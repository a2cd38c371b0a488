// torch's elastic file timer, served by the agent as torchrun's does
// (torch/distributed/elastic/timer/file_based_local_timer.py): with
// TORCHELASTIC_ENABLE_FILE_TIMER=1 the agent makes a FIFO (TORCHELASTIC_TIMER_FILE, else a fresh
// one), exports its path to the workers, reads FileTimerClient's JSON lines (acquire: an
// expiration time; release: -1), and when a timer expires sends its signal to that pid (only to
// a worker of this agent or a descendant of one, which torch does not check) and names the rank.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddp::launch {

struct TimerRequest {
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = 0;  // unix seconds; < 0: release
  int signal = 9;
};

// One line of the FIFO. nullopt (and *error says why) for a line that is not a request.
std::optional<TimerRequest> parse_timer_request(std::string_view line, std::string* error);

// The live timers, by (pid, scope). Pure.
class TimerTable {
 public:
  void apply(const TimerRequest& r);  // acquire or release
  // Removes and returns those with expiration_time <= now, by expiration time (then pid,
  // scope). torch then signals each pid with its earliest expired timer whose signal is > 0.
  std::vector<TimerRequest> take_expired(double now);
  std::optional<double> next_deadline() const;
  void forget_pid(pid_t pid);
  std::vector<pid_t> pids() const;  // with at least one live timer, ascending
  std::size_t size() const { return timers_.size(); }

 private:
  std::map<std::pair<pid_t, std::string>, TimerRequest> timers_;
};

class FileTimerServer {
 public:
  // nullptr unless TORCHELASTIC_ENABLE_FILE_TIMER is "1" in the agent's environment. The FIFO
  // is TORCHELASTIC_TIMER_FILE, else $TMPDIR (or /tmp)/watchdog_timer_<uuid4>; whatever was
  // there is removed first, as torch does. Throws ddp::ConfigError for an empty
  // TORCHELASTIC_TIMER_FILE, ddp::IoError when the FIFO cannot be made or opened.
  static std::unique_ptr<FileTimerServer> from_env(const std::map<std::string, std::string>& env);
  ~FileTimerServer();  // removes the FIFO
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }  // the workers' TORCHELASTIC_TIMER_FILE
  int fd() const { return read_fd_; }
  // Reads what is there; returns the valid requests (already applied to the table).
  std::vector<TimerRequest> on_readable();
  std::vector<TimerRequest> take_expired(double now) { return table_.take_expired(now); }
  // Milliseconds until the next expiry (-1: none).
  int timeout_ms(double now) const;
  void forget_pid(pid_t pid) { table_.forget_pid(pid); }
  // Drops the timers of pids that no longer exist (kill(pid, 0) fails with ESRCH), as torch's
  // server does on every pass, so that a recycled pid is never signalled.
  void forget_dead_pids();
  // Why lines were dropped since the last call (bad JSON, over-long line, ...), at most
  // kMaxErrors, then one line counting the rest.
  std::vector<std::string> take_errors();
  const TimerTable& table() const { return table_; }

  static constexpr std::size_t kMaxLineBytes = 64 * 1024;  // torch's client writes <= 4096
  static constexpr std::size_t kMaxErrors = 32;

 private:
  explicit FileTimerServer(std::string path);
  std::string path_;
  int read_fd_ = -1;
  int keep_fd_ = -1;  // a writer of our own, so poll() never sees a hang-up
  std::string pending_;
  bool discarding_ = false;  // inside a line longer than kMaxLineBytes
  TimerTable table_;
  std::vector<std::string> errors_;
  std::size_t errors_dropped_ = 0;
  unsigned long long fifo_dev_ = 0, fifo_ino_ = 0;  // ours to unlink only while unchanged
};

}  // namespace ddp::launch
