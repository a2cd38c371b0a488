// A worker's progress to its agent: ddprun hands each worker the write end of a non-blocking
// pipe and names it in DDPRUN_PROGRESS_FD (the line protocol is the agent's,
// launcher/health/include/ddp/launch/progress.hpp). ProgressWriter writes one short line per call,
// "step=<n> phase=<word> t=<unix seconds>[ samples=<n>][ total=<n>]\n" (samples: this rank's
// samples in the step; total: the run's steps, for the ETA), with one write(2) and no
// allocation. It never blocks and never throws: a full pipe drops the line (the next one carries
// the absolute step again), and a pipe whose reader is gone (EPIPE) or a descriptor closed under
// it turns the writer off. SIGPIPE: a write after the agent closed its end raises it, so the
// process must ignore SIGPIPE (ddp-train's main does, as CPython does at start) to get EPIPE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::worker {

// A line is at most this long (well under PIPE_BUF, so a write of it is atomic).
inline constexpr std::size_t kProgressLineMax = 320;
// An agent's line to the worker (take_line) is at most this long.
inline constexpr std::size_t kControlLineMax = 1024;

// A metric on a progress line (loss=2.31): its name (proto/metric_name.hpp) and value.
struct LineMetric {
  const char* name = nullptr;
  double value = 0;
};
inline constexpr std::size_t kLineMetrics = 4;  // metrics one line carries (ddp-train's)

// Pure: "step=<step>[ phase=<phase>][ t=<s>.<us>][ samples=<n>][ total=<n>][ <name>=<value>]...\n"
// into buf (kProgressLineMax bytes); returns its length. An empty phase or a negative unix_us,
// samples or total leaves that part out; a phase longer than 32 characters is cut there; a
// metric whose name is not a metric name, longer than 32 bytes, or whose value is not finite is
// left out; at most kLineMetrics metrics.
std::size_t format_progress_line(char* buf, std::int64_t step, std::string_view phase,
                                 std::int64_t unix_us, std::int64_t samples = -1,
                                 std::int64_t total = -1, const LineMetric* metrics = nullptr,
                                 std::size_t n_metrics = 0);

// Pure: DDPRUN_PROGRESS_FD's text as a descriptor number (3 and up: 0-2 are the standard
// streams), or nullopt with `why` naming the variable and what is wrong.
std::optional<int> parse_progress_fd(std::string_view text, std::string* why,
                                     std::string_view name = "DDPRUN_PROGRESS_FD");

class ProgressWriter {
 public:
  ProgressWriter() = default;  // off: report() does nothing

  // Writes to `fd` (not owned, never closed) when it is open for writing; sets O_NONBLOCK on
  // it when missing. Otherwise the writer is off and `why` says why.
  static ProgressWriter open(int fd, std::string* why);
  // From DDPRUN_PROGRESS_FD's value: nullopt (unset) is off with no reason; a bad value is off
  // with `why` set ("DDPRUN_PROGRESS_FD='x' ..."), which the caller prints once as a warning.
  static ProgressWriter from_env(const std::optional<std::string>& text, std::string* why);

  bool on() const { return fd_ >= 0; }
  // The run's total steps, on every line from now on as total=<n> (negative: none).
  void set_total(std::int64_t total) noexcept { total_ = total; }
  // One line, stamped with CLOCK_REALTIME: one write(2). Never blocks, never throws. samples:
  // the samples this rank processed in the step (negative: not said).
  void report(std::int64_t step, std::string_view phase, std::int64_t samples = -1) noexcept;
  // A metric for the next report()'s line (then forgotten): loss, lr, val_loss. `name` must
  // outlive that call (a string literal). At most kLineMetrics wait; a name given again
  // replaces its value.
  void metric(const char* name, double value) noexcept;
  // A line of its own for the agent, once (not a step): "recover=in_place" declares that this
  // worker recovers in place from a peer's death (docs/worker_runtime.md, "In-place recovery").
  void declare(std::string_view key_value) noexcept;
  // The agent's lines to this worker come on a pipe of their own (DDPRUN_CONTROL_FD, its read
  // end): it tells a running worker that its group changes (ddp/proto/regroup.hpp). listen()
  // makes it non-blocking; false (and `why`) when it is not an open descriptor for reading.
  bool listen(int control_fd, std::string* why);
  bool listening() const { return control_fd_ >= 0; }
  // One line from it without its newline; nullopt when no whole line is waiting (or there is no
  // control pipe). Never blocks. A line over kControlLineMax bytes is dropped whole.
  std::optional<std::string> take_line();
  std::uint64_t written() const { return written_; }
  std::uint64_t dropped() const { return dropped_; }  // the pipe was full

 private:
  int fd_ = -1;
  std::int64_t total_ = -1;
  LineMetric pending_[kLineMetrics];
  std::size_t n_pending_ = 0;
  std::uint64_t written_ = 0;
  std::uint64_t dropped_ = 0;
  int control_fd_ = -1;
  std::string in_;         // take_line(): what was read after the last whole line
  bool overlong_ = false;  // in_ is the tail of a line too long to keep
};

}  // namespace ddp::worker
