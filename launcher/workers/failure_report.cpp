// Failure summary in torchrun's layout (torch's ChildFailedError.format_msg, text for text:
// the rule's width, the failures numbered by rank, "-9 (pid: N)  (SIGKILL)"), error-file
// parsing, and the exit-code policy.
#include "ddp/launch/failure_report.hpp"

#include <string.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddp::launch {
namespace {

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

// Characters, as Python's len() counts them (UTF-8 continuation bytes do not count).
std::size_t text_width(const std::string& line) {
  return static_cast<std::size_t>(std::count_if(line.begin(), line.end(), [](char c) {
    return (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  }));
}

// One failure as torch's _FAILURE_FORMAT_TEMPLATE writes it: the exit code torchrun's way
// (-9 for a signal, the signal's name after the pid), the message's lines indented by 2.
std::string describe(std::size_t index, const Failure& f) {
  std::ostringstream out;
  const std::string name = f.exit.signal != 0 ? torchrun_signal_name(f.exit.signal) : "";
  out << "[" << index << "]:\n";
  out << "  time      : " << format_time(f.time()) << "\n";
  out << "  host      : " << f.host << "\n";
  out << "  rank      : " << f.global_rank << " (local_rank: " << f.exit.local_rank << ")\n";
  out << "  exitcode  : " << torchrun_exitcode(f.exit) << " (pid: " << f.exit.pid << ") "
      << (name.empty() ? "" : " (" + name + ")") << "\n";
  out << "  error_file: " << (f.reported ? f.error_file : "<N/A>") << "\n";
  std::string msg = failure_message(f);
  for (std::size_t at = msg.find('\n'); at != std::string::npos; at = msg.find('\n', at + 3)) {
    msg.insert(at + 1, "  ");
  }
  out << "  traceback : " << msg;
  return out.str();
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

std::string torchrun_signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "";
}

int torchrun_exitcode(const WorkerExit& e) { return e.signal != 0 ? -e.signal : e.exit_code; }

std::string failure_message(const Failure& f) {
  std::string msg;
  if (f.reported) {
    msg = !f.reported->traceback.empty() ? f.reported->traceback
          : !f.reported->message.empty() ? f.reported->message
                                         : "<N/A>";
  } else if (f.exit.signal != 0) {
    const std::string name = torchrun_signal_name(f.exit.signal);
    msg = "Signal " + std::to_string(f.exit.signal) + " (" + (name.empty() ? "<N/A>" : name) +
          ") received by PID " + std::to_string(f.exit.pid);
  } else {
    msg = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html";
  }
  if (f.exit.oom.named()) msg += (msg.back() == '\n' ? "" : "; ") + f.exit.oom.text();
  return msg;
}

std::string format_failure_summary(const std::string& name, std::vector<Failure> failures) {
  const std::string title = name + " FAILED";
  const Failure& root = root_cause(failures);
  // torch numbers the failures in its dict's order (by global rank), the root cause included.
  std::vector<const Failure*> by_rank;
  for (const auto& f : failures) by_rank.push_back(&f);
  std::stable_sort(by_rank.begin(), by_rank.end(), [](const Failure* a, const Failure* b) {
    return a->global_rank < b->global_rank;
  });
  std::string root_block;
  std::vector<std::string> others;
  std::size_t width = text_width(title);
  for (std::size_t i = 0; i < by_rank.size(); ++i) {
    std::string block = describe(i, *by_rank[i]);
    std::istringstream lines(block);
    for (std::string line; std::getline(lines, line);) width = std::max(width, text_width(line));
    if (by_rank[i] == &root) {
      root_block = std::move(block);
    } else {
      others.push_back(std::move(block));
    }
  }
  width = std::min<std::size_t>(width, 60);
  const std::string rule(width, '='), thin(width, '-');
  std::ostringstream out;
  out << rule << "\n" << title << "\n" << thin << "\nFailures:\n";
  if (others.empty()) out << "  <NO_OTHER_FAILURES>\n";
  for (const auto& b : others) out << b << "\n";
  out << thin << "\nRoot Cause (first observed failure):\n" << root_block << "\n" << rule << "\n";
  return out.str();
}

int exit_code_for(const std::vector<Failure>& failures) {
  if (failures.empty()) return 0;
  const auto& root = root_cause(failures);
  if (root.exit.signal != 0) return 128 + root.exit.signal;
  return root.exit.exit_code != 0 ? root.exit.exit_code : 1;
}

}  // namespace ddp::launch
