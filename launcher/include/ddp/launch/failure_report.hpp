// The failure summary torchrun prints when workers fail (torch-compat.md §3, "Error file and
// @record"), the worker error files it reads, and ddprun's exit code, which, unlike torchrun's
// constant 1, carries the root cause: its exit code, or 128 + signal. Pure formatting.
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

// torchrun's block: "<name> FAILED", the other failures, then the root cause (earliest).
std::string format_failure_summary(const std::string& name, std::vector<Failure> failures);

// 0 without failures; else the root cause's exit code, or 128 + its signal.
int exit_code_for(const std::vector<Failure>& failures);

}  // namespace ddp::launch
