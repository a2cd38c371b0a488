// The failure summary in torchrun's layout, torchrun's two error-file shapes, a broken error
// file, and the exit code that carries the root cause.
#include "ddp/launch/failure_report.hpp"

#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>

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
  CHECK_THAT(s, Catch::Contains("  exitcode  : 3 (pid: 1001)\n"));
  CHECK_THAT(s, Catch::Contains("  error_file: <N/A>\n"));
}

TEST_CASE("the earliest failure is the root cause; signals are named", "[unit][launch]") {
  auto late = failure(0, 0, 1, 0, 2000);
  auto early = failure(3, 3, 0, 11, 1000);
  std::vector<Failure> fs = {late, early};
  auto s = format_failure_summary("job", fs);
  auto root = s.find("Root Cause");
  REQUIRE(root != std::string::npos);
  CHECK(s.find("exitcode  : Signal 11 (SIGSEGV) (pid: 1003)", root) != std::string::npos);
  CHECK(s.find("traceback : Signal 11 (SIGSEGV) received by PID 1003", root) != std::string::npos);
  CHECK(s.substr(0, root).find("exitcode  : 1 (pid: 1000)") != std::string::npos);
  CHECK(exit_code_for(fs) == 128 + 11);
  CHECK(exit_code_for({late}) == 1);
  CHECK(exit_code_for({failure(0, 0, 42, 0, 1)}) == 42);
  CHECK(exit_code_for({}) == 0);
}

TEST_CASE("torchrun's error file shapes are read; their time decides the root cause",
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
  // continuation lines are indented by 4, on top of the traceback's own indentation
  CHECK(s.find("traceback : Traceback (most recent call last):\n      File \"t.py\"", root) !=
        std::string::npos);
  std::remove(nested.c_str());
  std::remove(flat.c_str());
  std::remove(broken.c_str());
}
