// Where the workers' stdout and stderr go. torchrun's file layout
// (<log_dir>/<run_id>_<rand>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}),
// its -r/--redirects (file only) and -t/--tee (file and console), --local-ranks-filter (which
// ranks reach the console), and ddprun's line prefix on the console, by default torchrun's
// "[<role><local_rank>]:". Console lines pass through the agent's event loop (OutputPump),
// written one whole line per write so lines of different workers never interleave.
#pragma once

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

// The run's log directory. An empty log_dir gives a fresh temporary one (torchrun's
// mkdtemp("torchelastic_")), "/dev/null" disables files (and error files) as in torchrun.
class RunLogDir {
 public:
  RunLogDir(const std::string& log_dir, const std::string& run_id);
  bool enabled() const { return !root_.empty(); }
  bool temporary() const { return temporary_; }
  const std::string& root() const { return root_; }
  // <root>/attempt_<n>, with one directory per local rank inside; "" when disabled.
  std::string make_attempt(int attempt, int nproc) const;
  // Removes the temporary directory (a --log-dir given by the user is never removed).
  void remove_if_temporary() const;

 private:
  std::string root_;
  std::string temp_base_;
  bool temporary_ = false;
};

class OutputPump {
 public:
  OutputPump(int console_out = 1, int console_err = 2);
  ~OutputPump();
  OutputPump(const OutputPump&) = delete;
  OutputPump& operator=(const OutputPump&) = delete;

  // Decides where local rank's streams go and sets spec.stdout_fd / stderr_fd. rank_dir is
  // "<attempt>/<local_rank>" ("" when files are disabled); prefix "" means raw lines.
  void attach(WorkerSpec& spec, int local_rank, const std::string& prefix, Std redirect, Std tee,
              bool on_console, const std::string& rank_dir);
  // Closes the agent's copies of the workers' ends; call after WorkerGroup::start.
  void after_start();

  std::vector<int> fds() const;  // read ends to poll
  void on_readable(int fd);      // moves what is there; closes the stream at EOF
  void drain();                  // after the workers exited: moves what is left, closes all

 private:
  struct Stream {
    int read_fd = -1;
    int console_fd = -1;  // -1: not shown
    int file_fd = -1;     // -1: no file
    std::string prefix;
    std::string pending;  // console text not yet written (an unfinished line)
    bool at_line_start = true;
  };
  // Returns the fd the worker should write to for one stream.
  int route(int local_rank, bool is_err, const std::string& prefix, bool to_file, bool tee,
            bool on_console, const std::string& path);
  bool pump(Stream& s);  // false at EOF
  void emit(Stream& s, bool all);
  void close_stream(Stream& s);

  int console_out_, console_err_;
  std::map<int, Stream> streams_;  // by read fd
  std::vector<int> child_ends_;
};

}  // namespace ddp::launch
