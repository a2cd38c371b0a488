// The failure summary in torchrun's layout (text for text with torch 2.15's format_msg),
// torchrun's two error-file shapes, a broken error file, the exit code that carries the root
// cause, an OOM kill named, and ddprun's own error file (agent_error_file.hpp).
#include "ddp/launch/failure_report.hpp"

#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ddp/launch/agent_error_file.hpp"

using namespace ddp::launch;

namespace {

Failure failure(int local_rank, int rank, int code, int sig, double when_s) {
  Failure f;
  f.exit.local_rank = local_rank;
  f.exit.pid = 1000 + local_rank;
  f.exit.exit_code = code;
  f.exit.signal = sig;
  f.exit.when = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::duration<double>(when_s)));
  f.global_rank = rank;
  f.host = "node7";
  return f;
}

std::string write_temp(const std::string& content) {
  char path[] = "/tmp/ddp-errfile-XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::close(fd);
  std::ofstream(path) << content;
  return path;
}

}  // namespace

TEST_CASE("a single failure prints torchrun's block with no other failures", "[unit][launch]") {
  auto s = format_failure_summary("train.py", {failure(1, 5, 3, 0, 1.7e9)});
  CHECK_THAT(s, Catch::StartsWith("============================================================\n"
                                  "train.py FAILED\n"));
  CHECK_THAT(s, Catch::Contains("Failures:\n  <NO_OTHER_FAILURES>\n"));
  CHECK_THAT(s, Catch::Contains("Root Cause (first observed failure):\n[0]:\n"));
  CHECK_THAT(s, Catch::Contains("  host      : node7\n"));
  CHECK_THAT(s, Catch::Contains("  rank      : 5 (local_rank: 1)\n"));
  CHECK_THAT(s, Catch::Contains("  exitcode  : 3 (pid: 1001) \n"));  // torch's trailing space
  CHECK_THAT(s, Catch::Contains("  error_file: <N/A>\n"));
  CHECK_THAT(s, Catch::Contains("  traceback : To enable traceback see: "
                                "https://pytorch.org/docs/stable/elastic/errors.html\n"));
}

TEST_CASE("a signal death reads as torchrun's, text for text", "[unit][launch]") {
  // torchrun 2.15, a worker that SIGKILLs itself (the rule is as wide as the widest line):
  const std::string torchrun =
      "=====================================================\n"
      "kill9.py FAILED\n"
      "-----------------------------------------------------\n"
      "Failures:\n"
      "  <NO_OTHER_FAILURES>\n"
      "-----------------------------------------------------\n"
      "Root Cause (first observed failure):\n"
      "[0]:\n"
      "  time      : TIME\n"
      "  host      : localhost\n"
      "  rank      : 0 (local_rank: 0)\n"
      "  exitcode  : -9 (pid: 8470)  (SIGKILL)\n"
      "  error_file: <N/A>\n"
      "  traceback : Signal 9 (SIGKILL) received by PID 8470\n"
      "=====================================================\n";
  auto f = failure(0, 0, 0, SIGKILL, 1.7e9);
  f.exit.pid = 8470;
  f.host = "localhost";
  auto s = format_failure_summary("kill9.py", {f});
  const auto at = s.find("  time      : ") + 14;
  s.replace(at, s.find('\n', at) - at, "TIME");
  CHECK(s == torchrun);
  CHECK(torchrun_exitcode(f.exit) == -9);
  CHECK(torchrun_signal_name(SIGSEGV) == "SIGSEGV");
}

TEST_CASE("the earliest failure is the root cause, signals are named", "[unit][launch]") {
  auto late = failure(0, 0, 1, 0, 2000);
  auto early = failure(3, 3, 0, 11, 1000);
  std::vector<Failure> fs = {late, early};
  auto s = format_failure_summary("job", fs);
  auto root = s.find("Root Cause");
  REQUIRE(root != std::string::npos);
  // Numbered as torch numbers them, by rank: rank 0 is [0], the root cause (rank 3) is [1].
  CHECK(s.find("[1]:\n", root) != std::string::npos);
  CHECK(s.find("exitcode  : -11 (pid: 1003)  (SIGSEGV)\n", root) != std::string::npos);
  CHECK(s.find("traceback : Signal 11 (SIGSEGV) received by PID 1003\n", root) !=
        std::string::npos);
  CHECK(s.substr(0, root).find("[0]:\n") != std::string::npos);
  CHECK(s.substr(0, root).find("exitcode  : 1 (pid: 1000) \n") != std::string::npos);
  CHECK(exit_code_for(fs) == 128 + 11);
  CHECK(exit_code_for({late}) == 1);
  CHECK(exit_code_for({failure(0, 0, 42, 0, 1)}) == 42);
  CHECK(exit_code_for({}) == 0);
}

TEST_CASE("torchrun's error file shapes are read, their time decides the root cause",
          "[unit][launch]") {
  auto nested = write_temp(R"({"message": {"message": "ValueError: bad lr",
      "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"t.py\"\nValueError: bad lr",
                    "timestamp": "500"}}})");
  auto flat = write_temp(R"({"message": "plain text", "timestamp": 600})");
  auto broken = write_temp("not json");
  auto a = read_error_file(nested);
  REQUIRE(a.has_value());
  CHECK(a->message == "ValueError: bad lr");
  CHECK(a->timestamp == Approx(500));
  auto b = read_error_file(flat);
  REQUIRE(b.has_value());
  CHECK(b->message == "plain text");
  CHECK(b->timestamp == Approx(600));
  auto c = read_error_file(broken);
  REQUIRE(c.has_value());
  CHECK_THAT(c->message, Catch::Contains("not torchrun's JSON"));
  CHECK_FALSE(read_error_file("/nonexistent/error.json").has_value());

  auto f1 = failure(0, 0, 1, 0, 9000);  // exited first, but its error says 500
  f1.error_file = nested;
  f1.reported = a;
  auto f2 = failure(1, 1, 1, 0, 100);
  f2.error_file = flat;
  f2.reported = b;
  auto s = format_failure_summary("t.py", {f2, f1});
  auto root = s.find("Root Cause");
  CHECK(s.find("error_file: " + nested, root) != std::string::npos);
  // continuation lines are indented by 2, on top of the traceback's own indentation (torch's
  // replace("\n", "\n  "))
  CHECK(s.find("traceback : Traceback (most recent call last):\n    File \"t.py\"\n  ValueError",
               root) != std::string::npos);
  std::remove(nested.c_str());
  std::remove(flat.c_str());
  std::remove(broken.c_str());
}

TEST_CASE("an OOM kill is named after torchrun's text", "[unit][launch]") {
  auto f = failure(0, 4, 0, SIGKILL, 1.7e9);
  f.exit.oom.kind = OomFinding::Kind::killed;
  f.exit.oom.detail = "oom_kill in /cg/memory.events went from 0 to 1 while it ran";
  auto s = format_failure_summary("t.py", {f});
  CHECK_THAT(s, Catch::Contains("  exitcode  : -9 (pid: 1000)  (SIGKILL)\n"));
  CHECK_THAT(s, Catch::Contains(
                    "  traceback : Signal 9 (SIGKILL) received by PID 1000; killed by the kernel's "
                    "OOM killer (out of memory): oom_kill in /cg/memory.events went from 0 to 1"));
  CHECK(f.exit.describe() ==
        "Signal 9 (SIGKILL), killed by the kernel's OOM killer (out of memory)");
  f.exit.oom.kind = OomFinding::Kind::possibly;
  CHECK(f.exit.describe() == "Signal 9 (SIGKILL), possibly out of memory");
}

namespace {
nlohmann::json parsed(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  REQUIRE_FALSE(j.is_discarded());
  return j;
}
}  // namespace

TEST_CASE("ddprun's error file copies the root cause's, with torchrun's errorCode",
          "[unit][launch]") {
  auto worker_file = write_temp(
      R"({"message": {"message": "ValueError: x", "extraInfo": {"py_callstack": "Traceback...",
          "timestamp": "500"}}})");
  auto f = failure(0, 0, 3, 0, 9000);
  f.error_file = worker_file;
  f.reported = read_error_file(worker_file);
  auto late = failure(1, 1, 0, SIGKILL, 9999);
  auto j = parsed(agent_error_json("t.py", {late, f}));
  CHECK(j["message"]["message"] == "ValueError: x");
  CHECK(j["message"]["extraInfo"]["py_callstack"] == "Traceback...");
  CHECK(j["message"]["extraInfo"]["timestamp"] == "500");
  CHECK(j["message"]["errorCode"] == 3);
  // The flat shape is copied as it is.
  std::ofstream(worker_file) << R"({"message": "plain", "timestamp": 7})";
  f.reported = read_error_file(worker_file);
  CHECK(parsed(agent_error_json("t.py", {f})) == parsed(R"({"message": "plain", "timestamp": 7})"));
  std::remove(worker_file.c_str());
}

TEST_CASE("without a worker error file, ddprun writes torch's shape itself", "[unit][launch]") {
  auto f = failure(2, 6, 0, SIGKILL, 1234.5);
  f.exit.oom.kind = OomFinding::Kind::killed;
  auto j = parsed(agent_error_json("t.py", {f}));
  CHECK_THAT(j["message"]["message"].get<std::string>(),
             Catch::StartsWith("Signal 9 (SIGKILL) received by PID 1002; killed by the kernel's "
                               "OOM killer"));
  CHECK_THAT(j["message"]["extraInfo"]["py_callstack"].get<std::string>(),
             Catch::Contains("t.py FAILED"));
  CHECK(j["message"]["extraInfo"]["timestamp"] == "1234");
  CHECK(j["message"]["errorCode"] == -9);
  auto own = parsed(agent_error_json("ddprun: rendezvous timed out", 99.9));
  CHECK(own["message"]["message"] == "ddprun: rendezvous timed out");
  CHECK(own["message"]["extraInfo"]["timestamp"] == "99");
  CHECK_FALSE(own["message"].contains("errorCode"));  // as record_exception's
}

TEST_CASE("the agent's error file is written only on failure, where asked", "[unit][launch]") {
  CHECK(parsed(fallback_error_json(128 + SIGTERM, ""))["message"]["message"] ==
        "SignalException: Process " + std::to_string(::getpid()) + " got signal: 15");
  CHECK(parsed(fallback_error_json(1, "ddprun: bad"))["message"]["message"] == "ddprun: bad");
  CHECK_THAT(parsed(fallback_error_json(3, ""))["message"]["message"].get<std::string>(),
             Catch::Contains("code 3"));
  auto path = write_temp("");
  std::remove(path.c_str());
  note_agent_error("rank 3 (local_rank 1) on n1 (group rank 1) failed: exit code 4");
  write_agent_error_file({{"TORCHELASTIC_ERROR_FILE", path}}, 0, "");
  CHECK_FALSE(std::ifstream(path).good());     // success: nothing written
  write_agent_error_file({}, 4, "ddprun: x");  // not asked: nothing, nowhere
  write_agent_error_file({{"TORCHELASTIC_ERROR_FILE", path}}, 4, "");
  std::ifstream in(path);
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  CHECK_THAT(parsed(text.str())["message"]["message"].get<std::string>(),
             Catch::EndsWith("failed: exit code 4"));
  std::remove(path.c_str());
}
