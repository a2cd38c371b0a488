// ddprun's own error file. When ddprun runs with TORCHELASTIC_ERROR_FILE set (a scheduler or
// a parent launcher asked for one), a failed job leaves its root cause there, as torchrun's
// @record'ed main does (torch's ErrorHandler):
//  - a worker that wrote an error file: that file's JSON, copied, with "errorCode" set to
//    torchrun's exitcode in its "message" object (ErrorHandler.dump_error_file);
//  - a worker that wrote none (a signal, an OOM kill, a plain exit code), which torchrun leaves
//    unwritten: ddprun writes the same shape itself, {"message": {"message", "extraInfo":
//    {"py_callstack": the failure summary, "timestamp"}, "errorCode"}};
//  - any other failure of the agent (an error, a failure on another node, a stop signal):
//    ErrorHandler.record_exception's shape, {"message": {"message", "extraInfo"}}.
// The lifecycle notes the root cause when it reports it; main() writes the file at exit.
#pragma once

#include <string>
#include <vector>

#include "ddp/launch/failure_report.hpp"
#include "ddp/launch/worker_env.hpp"

namespace ddp::launch {

// The file's content for this node's worker failures (pure but for reading the root cause's
// error file): the copy with "errorCode", or ddprun's own JSON naming the failure.
std::string agent_error_json(const std::string& entrypoint, const std::vector<Failure>& failures);
// record_exception's shape for a failure of the agent itself.
std::string agent_error_json(const std::string& message, double unix_seconds);

// What the lifecycle saw as the job's root cause, kept for main(): the last note wins.
void note_worker_failures(const std::string& entrypoint, const std::vector<Failure>& failures);
void note_agent_error(const std::string& message);

// With nothing noted: `error` (ddprun's own error message), else torch's SignalException text
// for 128 + a signal, else a line naming the exit code; record_exception's shape.
std::string fallback_error_json(int exit_code, const std::string& error);

// At exit: with exit_code != 0 and TORCHELASTIC_ERROR_FILE set in `agent_env` (ddprun's own
// environment, not a worker's), writes the noted root cause there; with nothing noted,
// `error` (ddprun's error message) or a line naming the exit code. A file that cannot be
// written is reported on stderr, and the exit code stays as it is.
void write_agent_error_file(const EnvMap& agent_env, int exit_code, const std::string& error);

}  // namespace ddp::launch
