// Failure summary in torchrun's layout, error-file parsing, and the exit-code policy.
#include "ddp/launch/failure_report.hpp"

#include <algorithm>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddp::launch {
namespace {

constexpr const char* kRule = "============================================================";
constexpr const char* kThin = "------------------------------------------------------------";

std::string format_time(double unix_seconds) {
  std::time_t t = static_cast<std::time_t>(unix_seconds);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%d_%H:%M:%S", &tm);
  return buf;
}

const Failure& root_cause(const std::vector<Failure>& f) {
  return *std::min_element(f.begin(), f.end(),
                           [](const Failure& a, const Failure& b) { return a.time() < b.time(); });
}

void describe(std::ostringstream& out, int index, const Failure& f) {
  out << "[" << index << "]:\n";
  out << "  time      : " << format_time(f.time()) << "\n";
  out << "  host      : " << f.host << "\n";
  out << "  rank      : " << f.global_rank << " (local_rank: " << f.exit.local_rank << ")\n";
  out << "  exitcode  : " << f.exit.describe() << " (pid: " << f.exit.pid << ")\n";
  out << "  error_file: " << (f.reported ? f.error_file : "<N/A>") << "\n";
  std::string tb;
  if (f.reported) {
    tb = f.reported->traceback.empty() ? f.reported->message : f.reported->traceback;
  } else if (f.exit.signal != 0) {
    tb = f.exit.describe() + " received by PID " + std::to_string(f.exit.pid);
  } else {
    tb = "the worker wrote no error file (see its output above)";
  }
  std::istringstream lines(tb);
  std::string line;
  bool first = true;
  while (std::getline(lines, line)) {
    out << (first ? "  traceback : " : "    ") << line << "\n";
    first = false;
  }
  if (first) out << "  traceback : <N/A>\n";
}

}  // namespace

double Failure::time() const {
  if (reported && reported->timestamp) return *reported->timestamp;
  return std::chrono::duration<double>(exit.when.time_since_epoch()).count();
}

std::optional<ErrorFile> read_error_file(const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream raw;
  raw << in.rdbuf();
  ErrorFile e;
  auto j = nlohmann::json::parse(raw.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("message")) {
    e.message = "unreadable error file " + path + " (not torchrun's JSON)";
    return e;
  }
  const auto& m = j["message"];
  auto as_time = [](const nlohmann::json& v) -> std::optional<double> {
    if (v.is_number()) return v.get<double>();
    if (v.is_string()) {
      try {
        return std::stod(v.get<std::string>());
      } catch (...) {
      }
    }
    return std::nullopt;
  };
  if (m.is_object()) {  // {"message": {"message": "...", "extraInfo": {"py_callstack",
                        // "timestamp"}}}
    e.message = m.value("message", "");
    if (m.contains("extraInfo") && m["extraInfo"].is_object()) {
      const auto& x = m["extraInfo"];
      if (x.contains("py_callstack") && x["py_callstack"].is_string()) {
        e.traceback = x["py_callstack"].get<std::string>();
      }
      if (x.contains("timestamp")) e.timestamp = as_time(x["timestamp"]);
    }
  } else if (m.is_string()) {  // {"message": "...", "timestamp": 123}
    e.message = m.get<std::string>();
    if (j.contains("timestamp")) e.timestamp = as_time(j["timestamp"]);
  }
  return e;
}

std::string format_failure_summary(const std::string& name, std::vector<Failure> failures) {
  std::ostringstream out;
  out << kRule << "\n" << name << " FAILED\n" << kThin << "\nFailures:\n";
  const Failure& root = root_cause(failures);
  int index = 1;
  bool others = false;
  for (const auto& f : failures) {
    if (&f == &root) continue;
    describe(out, index++, f);
    others = true;
  }
  if (!others) out << "  <NO_OTHER_FAILURES>\n";
  out << kThin << "\nRoot Cause (first observed failure):\n";
  describe(out, 0, root);
  out << kRule << "\n";
  return out.str();
}

int exit_code_for(const std::vector<Failure>& failures) {
  if (failures.empty()) return 0;
  const auto& root = root_cause(failures);
  if (root.exit.signal != 0) return 128 + root.exit.signal;
  return root.exit.exit_code != 0 ? root.exit.exit_code : 1;
}

}  // namespace ddp::launch
