// Where the workers' stdout and stderr go. torchrun's file layout
// (<log_dir>/<run_id>_<rand>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}),
// its -r/--redirects (file only) and -t/--tee (file and console), --local-ranks-filter (which
// ranks reach the console), and ddprun's line prefix on the console, by default torchrun's
// "[<role><local_rank>]:". Console lines pass through the agent's event loop (OutputPump),
// assembled per worker up to kMaxLineBytes and written whole, so lines of different workers
// never interleave; a longer line is cut with a visible marker. Log files are written by the
// pump too: a full disk (ENOSPC, EIO, EFBIG) is reported once per file and the job goes on.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "ddp/launch/config.hpp"
#include "ddp/launch/worker_group.hpp"

namespace ddp::launch {

// The variables a prefix template may use: ${role_name} ${local_rank} ${rank} ${group_rank}
// ${host} (the first three are torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE names).
struct PrefixVars {
  std::string role_name;
  int local_rank = 0;
  int rank = 0;
  int group_rank = 0;
  std::string host;
};

// Expands the template. Throws ddp::ConfigError naming an unknown ${name}.
std::string expand_prefix(const std::string& tmpl, const PrefixVars& vars);

inline constexpr const char* kDefaultPrefixTemplate = "[${role_name}${local_rank}]:";

// The longest console line the agent assembles for a worker. A longer one is written as its
// first kMaxLineBytes bytes, then line_cut_marker() and a newline; the rest continues as a new
// prefixed line. The agent holds at most this much (plus one read) per pumped stream.
inline constexpr std::size_t kMaxLineBytes = std::size_t{4} << 20;
// "…[ddprun: line cut at N bytes]" (no newline).
std::string line_cut_marker(std::size_t bytes);

// The run's log directory. An empty log_dir gives a fresh temporary one (torchrun's
// mkdtemp("torchelastic_")), "/dev/null" disables files (and error files) as in torchrun.
class RunLogDir {
 public:
  RunLogDir(const std::string& log_dir, const std::string& run_id);
  bool enabled() const { return !root_.empty(); }
  bool temporary() const { return temporary_; }
  const std::string& root() const { return root_; }
  // Creates <root>/attempt_<n> and returns it; "" when disabled. Throws ddp::IoError.
  std::string make_attempt(int attempt) const;
  // Creates <attempt_dir>/<local_rank> (made when that rank is spawned, not before) and returns
  // it; "" when attempt_dir is "". Throws ddp::IoError naming the directory.
  static std::string make_rank_dir(const std::string& attempt_dir, int local_rank);
  // Removes the temporary directory (a --log-dir given by the user is never removed), unless
  // keep() was called: it holds output the user asked for (--redirects / --tee files).
  void remove_if_temporary() const;
  void keep() { keep_ = true; }
  bool kept() const { return temporary_ && keep_; }

 private:
  std::string root_;
  std::string temp_base_;
  bool temporary_ = false;
  bool keep_ = false;
};

class OutputPump {
 public:
  // console_err also gets the pump's own warnings (a log file that cannot be written).
  explicit OutputPump(int console_out = 1, int console_err = 2,
                      std::size_t max_line_bytes = kMaxLineBytes);
  ~OutputPump();
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  // Decides where local rank's streams go and sets spec.stdout_fd / stderr_fd. rank_dir is
  // "<attempt>/<local_rank>" ("" when files are disabled); prefix "" means raw lines. With an
  // empty prefix, the console only and no file, the worker gets the agent's own fd (a terminal
  // stays a terminal; its lines can then interleave, as under torchrun). Throws ddp::IoError
  // when a log file cannot be created.
  void attach(WorkerSpec& spec, int local_rank, const std::string& prefix, Std redirect, Std tee,
              bool on_console, const std::string& rank_dir);
  // --duplicate-stdout/stderr-filters: every console line of that stream holding any of
  // `filters` also goes, prefixed as on the console, to `path` (torchrun's
  // <attempt>/filtered_stdout.log and filtered_stderr.log). Call before attach(). Throws
  // ddp::IoError when the file cannot be created.
  void duplicate(bool is_err, const std::vector<std::string>& filters, const std::string& path);
  // Closes the agent's copies of the workers' ends; call after WorkerGroup::start.
  void after_start();

  std::vector<int> fds() const;  // read ends to poll
  void on_readable(int fd);      // moves what is there; closes the stream at EOF
  void drain();                  // after the workers exited: moves what is left, closes all

 private:
  struct Stream {
    int read_fd = -1;
    int console_fd = -1;  // -1: not shown
    int file_fd = -1;     // -1: no file (or no longer: it failed)
    std::string file_path;
    std::string prefix;
    bool is_err = false;
    std::string pending;      // console text not yet written: the start of a line
    std::size_t scanned = 0;  // bytes of pending known to hold no line end
    bool at_line_start = true;
  };
  // Returns the fd the worker should write to for one stream.
  int route(int local_rank, bool is_err, const std::string& prefix, bool to_file, bool tee,
            bool on_console, const std::string& path);
  bool pump(Stream& s);  // false at EOF
  void emit(Stream& s, bool all);
  void write_file(Stream& s, const char* p, std::size_t n);
  void close_stream(Stream& s);

  struct Duplicate {
    std::vector<std::string> filters;
    int fd = -1;
    std::string path;
  };
  bool matches(const Duplicate& d, const char* line, std::size_t n) const;

  int console_out_, console_err_;
  Duplicate dup_[2];  // [is_err]
  std::size_t max_line_;
  std::map<int, Stream> streams_;  // by read fd
  std::vector<int> child_ends_;
};

}  // namespace ddp::launch
