// Tests of proc_sample.hpp: /proc/<pid>/stat lines whose comm holds spaces and parentheses,
// garbled lines, and samples of real processes (this one, a child sleeping in the kernel, one
// that is gone).
#include "ddp/launch/proc_sample.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

using namespace ddp::launch;

namespace {

// A real line (python3 in gloo's all_reduce), fields after the comm as the kernel writes them.
const std::string kTail =
    " S 1234 1234 1200 34816 1234 4194560 91234 0 12 0 1517 204 0 0 20 0 9 0 123456 "
    "2222718976 90000 18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 17 3 0 0 0 0 0 0 0 0 0 "
    "0 0 0 0\n";

}  // namespace

TEST_CASE("proc stat: state and utime + stime", "[unit][launch][proc]") {
  auto s = parse_proc_stat("4321 (python3)" + kTail);
  REQUIRE(s);
  CHECK(s->state == 'S');
  CHECK(s->cpu_ticks == 1517 + 204);
  CHECK(s->wchan.empty());
}

TEST_CASE("proc stat: a comm with spaces and parentheses", "[unit][launch][proc]") {
  for (const char* comm :
       {"a) (b", ") (", "x) R 1 2 (y", "pt main thread", "()", "(", ")", "a)b) (c) 9 9"}) {
    INFO("comm: " << comm);
    auto s = parse_proc_stat("77 (" + std::string(comm) + ")" + kTail);
    REQUIRE(s);
    CHECK(s->state == 'S');
    CHECK(s->cpu_ticks == 1721);
  }
  auto r = parse_proc_stat("9 (a) (b) R 1 1 1 0 -1 0 0 0 0 0 18446744073709551000 615 0 0");
  REQUIRE(r);
  CHECK(r->state == 'R');
  CHECK(r->cpu_ticks == 18446744073709551000ULL + 615);
}

TEST_CASE("proc stat: garbled text is refused", "[unit][launch][proc]") {
  for (const std::string& bad :
       {std::string(), std::string("garbage"), "4321 python3" + kTail, "4321 (python3" + kTail,
        "(python3)" + kTail, "x (python3)" + kTail, "4321(python3)" + kTail,
        std::string("4321 (python3) S 1 2 3"),                      // cut short
        std::string("4321 (python3) SS 1 1 1 0 -1 0 0 0 0 0 5 6"),  // state
        std::string("4321 (python3) S 1 1 1 0 -1 0 0 0 0 0 x 6"),   // utime
        std::string("4321 (python3) S 1 1 1 0 -1 0 0 0 0 0 5 -6"),  // stime
        std::string("4321 (python3) S 1 1 1 0 -1 0 0 0 0 0 5 99999999999999999999999")}) {
    INFO("text: " << bad);
    CHECK_FALSE(parse_proc_stat(bad));
  }
}

TEST_CASE("samples of real processes", "[unit][launch][proc]") {
  CHECK(clock_ticks_per_second() > 0);

  auto self = sample_process(::getpid());
  REQUIRE(self);
  CHECK(self->state == 'R');  // reading its own stat

  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::pause();
    ::_exit(0);
  }
  std::optional<ProcSample> sleeping;
  for (int i = 0; i < 500; ++i) {  // until it reached pause() (bounded: 5 s)
    sleeping = sample_process(child);
    if (sleeping && sleeping->state == 'S') break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(sleeping);
  CHECK(sleeping->state == 'S');
  std::ifstream wchan("/proc/" + std::to_string(child) + "/wchan");
  std::string expected;
  std::getline(wchan, expected);
  if (expected != "0") CHECK(sleeping->wchan == expected);  // the kernel's name, when it shows it

  ::kill(child, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK_FALSE(sample_process(child));  // gone and reaped
}
