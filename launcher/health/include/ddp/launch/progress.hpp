// Progress from the workers, with no store traffic per step: each worker gets the write end of
// a pipe of its own, named by DDPRUN_PROGRESS_FD, and writes one short line per step
// ("step=<n> [phase=<word>] [t=<unix seconds>] [samples=<n>] [total=<n>] [<metric>=<number>]...",
// or just "<n>"); ddp-train does so natively. samples: samples this rank processed in the step
// (for samples/s); total: the steps the run will take (for the ETA); any other key=value is a
// metric (loss=2.31 lr=3e-4 tokens_per_s=5120: proto/metric_name.hpp names what a key may be).
// The agent reads the lines in its event loop and keeps, per local rank, the last step, when
// it last changed, and the recent step durations (for stragglers). Writers never block (the
// pipe is non-blocking; a full pipe drops the line, and every line carries the absolute step).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <utility>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::launch {

using SteadyTime = std::chrono::steady_clock::time_point;

struct ProgressLine {
  std::int64_t step = 0;
  std::string phase;          // "" when not given
  std::optional<double> t;    // the worker's own clock, unix seconds
  std::int64_t samples = -1;  // samples in this step (-1: not given)
  std::int64_t total = -1;    // the run's total steps (-1: not given)
  // "recover=in_place": the worker recovers in place from a peer's death (docs/worker_runtime.md);
  // "recover=restart" withdraws that (its death restarts the job again). Such a line may carry
  // no step (step is then -1).
  bool recover_in_place = false;
  bool recover_restart = false;
  // "recover=elastic": in place, and it also regroups when its elastic job shrinks or grows
  // around it (the agent's regroup line; recover_in_place is set too).
  bool recover_regroup = false;
  // The metrics on the line (at most kMaxLineMetrics), and those that were not: a value that is
  // not a finite number, a bad name, or past kMaxLineMetrics.
  std::vector<std::pair<std::string, double>> metrics;
  int bad_metrics = 0;
  std::string bad_metric;  // the first bad one and why: "'loss=abc': not a finite number"
};
inline constexpr std::size_t kMaxLineMetrics = 32;

// One finished step of a rank on the wall clock, for the trace (status/trace).
struct StepSpan {
  std::int64_t step = 0;
  double start_unix = 0;
  double end_unix = 0;
};
inline constexpr std::size_t kTraceSteps = 4096;  // step spans kept per rank (the newest)

// One line without its newline. nullopt for a line that is not progress (ignored, counted).
// A trailing '\r' and blanks around the line are ignored; keys other than step, phase and t are
// metrics (bad ones counted on the line, which still counts); a step must be a non-negative 64-bit
// integer, t a finite number >= 0.
std::optional<ProgressLine> parse_progress_line(std::string_view line);

inline constexpr std::size_t kStepHistory = 16;  // step durations kept per rank
// A longer line (without its newline) is dropped and counted as bad; lines of at most PIPE_BUF
// bytes are written atomically, so a real progress line is far shorter.
inline constexpr std::size_t kMaxProgressLine = 4096;

struct RankProgress {
  std::int64_t step = -1;  // -1: none reported yet
  std::string phase;
  bool reported = false;       // wrote at least one valid line
  SteadyTime last_change{};    // spawn time, then the last step or phase change
  std::vector<double> step_s;  // the last kStepHistory step durations, oldest first
  std::uint64_t bad_lines = 0;
  SteadyTime step_change{};  // the first report, then the last step change (durations start here)
  // Step times, on the worker's clock (t=) when it gives one, else on arrival: a rank that
  // reports phase "compute" is timed by that phase alone (under a synchronous all-reduce every
  // rank finishes its steps at the slowest one's pace; only the compute phase tells them
  // apart); a rank without phases by the interval between steps.
  double clock_at = -1;  // the clock at `step_at`
  std::int64_t step_at = -1;
  double compute_from = -1;        // the clock where the current compute phase began (-1: none)
  bool phased = false;             // reported phase "compute" at least once
  std::int64_t samples = -1;       // the last samples= (per step)
  std::int64_t total_steps = -1;   // the last total=
  double unix_at = -1;             // wall clock of the current step's first line
  std::deque<StepSpan> spans;      // finished steps, the newest kTraceSteps
  bool recovers_in_place = false;  // declared "recover=in_place" (or "elastic")
  bool regroups = false;           // declared "recover=elastic"
  double first_step_unix = -1;     // wall clock of the first step line (a replacement's heal)
  double healed_unix = -1;         // wall clock of the first line after a phase=heal line
  // The latest value of each metric (at most ddp::kMaxRankMetrics names; a new name past that
  // is dropped and counted in bad_metrics), the step and the ordinal of the line that set it.
  struct Metric {
    double value = 0;
    std::int64_t step = 0;
    std::uint64_t line = 0;
  };
  std::map<std::string, Metric> metrics;
  std::uint64_t metric_lines = 0;  // lines that carried a metric
  std::uint64_t bad_metrics = 0;
  std::string bad_metric;  // the first bad one of this worker and why (ProgressLine's)
};

// The per-worker pipes of one round.
class ProgressReader {
 public:
  ProgressReader() = default;
  ~ProgressReader();
  ProgressReader(const ProgressReader&) = delete;
  ProgressReader& operator=(const ProgressReader&) = delete;

  // Makes local rank's pipe and returns its write end for the worker (O_NONBLOCK, O_CLOEXEC:
  // WorkerGroup keeps it open across exec in that worker only). Throws ddp::IoError.
  int open_rank(int local_rank, SteadyTime now);
  // The agent's copies of the write ends are closed after the workers started.
  void after_start();
  std::vector<int> fds() const;  // the read ends (drained at each check, not polled)
  // The other way: each rank also gets a control pipe, agent to worker. control_end() is the
  // worker's read end (for DDPRUN_CONTROL_FD, closed here by after_start(); -1: none); tell()
  // writes `line` (newline included) to it, whole or not at all (false: no such rank, the
  // worker is gone, or the pipe is full). Lines are far shorter than PIPE_BUF.
  int control_end(int local_rank) const;
  bool tell(int local_rank, std::string_view line);
  void on_readable(int fd, SteadyTime now);
  // Progress by another channel (torch's file timer: an acquire or release).
  void note_activity(int local_rank, SteadyTime now);
  const std::map<int, RankProgress>& ranks() const { return ranks_; }

  // Pure: applies one parsed line to a rank's state (exposed for tests).
  static void apply(RankProgress& r, const ProgressLine& line, SteadyTime now);

 private:
  struct Pipe {
    int local_rank = 0;
    int read_fd = -1;
    int write_fd = -1;
    int control_read = -1;   // the worker's, until after_start()
    int control_write = -1;  // the agent's: tell()
    std::string pending;
    bool overlong = false;  // dropping the rest of a line longer than kMaxProgressLine
  };
  static void close_pipe(Pipe& p);
  std::map<int, Pipe> pipes_;  // by read fd
  std::map<int, RankProgress> ranks_;
};

}  // namespace ddp::launch
