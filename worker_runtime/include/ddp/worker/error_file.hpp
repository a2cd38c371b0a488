// A failing worker's report to its agent: TORCHELASTIC_ERROR_FILE in the format torchrun's
// @record writes (torch-compat.md §3, "Error file and @record"), so ddprun and torchrun both
// print its message and traceback in their failure summary. Written atomically (a temporary
// file, then rename), so the agent never reads half a report.
#pragma once

#include <string>

namespace ddp::worker {

// The exit code a ddp worker uses after reporting an error it caught (documented in
// docs/worker_runtime.md); a crash keeps its signal.
inline constexpr int kWorkerErrorExitCode = 1;

// Writes {"message": {"message": "<type>: <what>", "extraInfo": {"py_callstack": <trace>,
// "timestamp": "<unix seconds>"}}}. An empty path does nothing. Returns false (and leaves no
// partial file) when the file cannot be written: the worker must still exit.
bool write_error_file(const std::string& path, const std::string& error_type,
                      const std::string& what, const std::string& trace);

}  // namespace ddp::worker
