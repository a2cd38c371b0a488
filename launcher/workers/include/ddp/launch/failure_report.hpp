// The failure summary torchrun prints when workers fail (torch-compat.md §3, "Error file and
// @record"), the worker error files it reads, and ddprun's exit code, which, unlike torchrun's
// constant 1, carries the root cause: its exit code, or 128 + signal. Pure formatting; a
// worker killed by the kernel's OOM killer is named after torchrun's text.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "ddp/launch/worker_group.hpp"

namespace ddp::launch {

// What a worker wrote to $TORCHELASTIC_ERROR_FILE (torchrun's JSON, both accepted shapes).
struct ErrorFile {
  std::string message;
  std::string traceback;
  std::optional<double> timestamp;  // unix seconds
};

// Reads one error file; nullopt when it is absent. A file that is not torchrun's JSON gives
// an ErrorFile whose message says so (the summary must still be printed).
std::optional<ErrorFile> read_error_file(const std::string& path);

struct Failure {
  WorkerExit exit;
  int global_rank = 0;
  std::string host;
  std::string error_file;             // path given to the worker; empty if none
  std::optional<ErrorFile> reported;  // its content, when the worker wrote one
  double time() const;                // the error file's timestamp, else the exit time
};

// torchrun's exitcode: -N for a death by signal N, else the exit code.
int torchrun_exitcode(const WorkerExit& e);
// Python's name of a signal ("SIGKILL"); "" when it has none.
std::string torchrun_signal_name(int sig);
// The failure's "traceback" as torchrun shows it: the error file's traceback (else message),
// else "Signal 9 (SIGKILL) received by PID 42", else torch's hint about @record. What the
// OOM-kill counters found (oom.hpp) follows, after "; ".
std::string failure_message(const Failure& f);

// torchrun's block, text for text: "<name> FAILED", the other failures, then the root cause
// (earliest); rules as wide as the widest line, at most 60.
std::string format_failure_summary(const std::string& name, std::vector<Failure> failures);

// 0 without failures; else the root cause's exit code, or 128 + its signal.
int exit_code_for(const std::vector<Failure>& failures);

}  // namespace ddp::launch
