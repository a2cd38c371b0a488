// ddprun's own TORCHELASTIC_ERROR_FILE (see agent_error_file.hpp): the JSON torch's
// ErrorHandler would write for the same root cause, noted when the lifecycle reports it and
// written by main() at exit.
#include "ddp/launch/agent_error_file.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ddp/proto/knobs.hpp"

namespace ddp::launch {
namespace {

using Json = nlohmann::ordered_json;  // keys stay in the order torch writes them

std::string& noted() {
  static std::string json;
  return json;
}

std::string timestamp_text(double unix_seconds) {
  return std::to_string(static_cast<long long>(unix_seconds));  // torch: str(int(time.time()))
}

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The worker's error file as torch's dump_error_file copies it, or nullopt when it is not
// torch's JSON (then ddprun describes the failure itself).
std::optional<Json> copied_error_file(const Failure& root) {
  if (!root.reported || root.error_file.empty()) return std::nullopt;
  std::ifstream in(root.error_file);
  if (!in) return std::nullopt;
  std::stringstream raw;
  raw << in.rdbuf();
  Json j = Json::parse(raw.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) return std::nullopt;
  // "errorCode" only goes into the nested shape, and only for a nonzero exitcode (torch's
  // override_error_code_in_rootcause_data).
  const int code = torchrun_exitcode(root.exit);
  if (code != 0 && j["message"].is_object()) j["message"]["errorCode"] = code;
  return j;
}

}  // namespace

std::string agent_error_json(const std::string& entrypoint, const std::vector<Failure>& failures) {
  if (failures.empty()) return agent_error_json(entrypoint + " FAILED", now());
  const Failure& root =
      *std::min_element(failures.begin(), failures.end(),
                        [](const Failure& a, const Failure& b) { return a.time() < b.time(); });
  if (auto copy = copied_error_file(root)) return copy->dump();
  Json j;
  j["message"]["message"] = failure_message(root);
  j["message"]["extraInfo"]["py_callstack"] = format_failure_summary(entrypoint, failures);
  j["message"]["extraInfo"]["timestamp"] = timestamp_text(root.time());
  j["message"]["errorCode"] = torchrun_exitcode(root.exit);
  return j.dump();
}

std::string agent_error_json(const std::string& message, double unix_seconds) {
  Json j;
  j["message"]["message"] = message;
  j["message"]["extraInfo"]["py_callstack"] = message;
  j["message"]["extraInfo"]["timestamp"] = timestamp_text(unix_seconds);
  return j.dump();
}

void note_worker_failures(const std::string& entrypoint, const std::vector<Failure>& failures) {
  noted() = agent_error_json(entrypoint, failures);
}

void note_agent_error(const std::string& message) { noted() = agent_error_json(message, now()); }

std::string fallback_error_json(int exit_code, const std::string& error) {
  std::string message = error;
  if (message.empty() && exit_code > 128 && exit_code < 128 + NSIG) {
    // torch's SignalException, as torchrun's main records it on a stop signal
    message = "SignalException: Process " + std::to_string(::getpid()) +
              " got signal: " + std::to_string(exit_code - 128);
  } else if (message.empty()) {
    message = "ddprun exited with code " + std::to_string(exit_code) + " (see its output)";
  }
  return agent_error_json(message, now());
}

void write_agent_error_file(const EnvMap& agent_env, int exit_code, const std::string& error) {
  if (exit_code == 0) return;
  const auto path = knobs::text("TORCHELASTIC_ERROR_FILE", &agent_env);
  if (!path || path->empty()) return;
  const std::string json = noted().empty() ? fallback_error_json(exit_code, error) : noted();
  std::ofstream out(*path, std::ios::trunc);
  out << json;
  out.close();
  if (!out) {
    std::fprintf(stderr, "ddprun: cannot write the error file %s (TORCHELASTIC_ERROR_FILE): %s\n",
                 path->c_str(), std::strerror(errno));
  }
}

}  // namespace ddp::launch
