// Tests of proc_sample.hpp: /proc/<pid>/stat lines whose comm holds spaces and parentheses,
// garbled lines, the resident set size, and samples of real processes (this one, a child
// sleeping in the kernel, one holding 32 MiB, one that is gone).
#include "ddp/launch/proc_sample.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
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
  CHECK(s->rss_bytes == 90000 * page_size_bytes());  // field 24, in pages
}

TEST_CASE("proc stat: rss is optional but never garbled", "[unit][launch][proc]") {
  // Cut after stime or before rss: parsed, rss unknown (0).
  auto cut = parse_proc_stat("5 (w) S 1 1 1 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 99 4096");
  REQUIRE(cut);
  CHECK(cut->cpu_ticks == 15);
  CHECK(cut->rss_bytes == 0);
  auto zero = parse_proc_stat("5 (w) Z 1 1 1 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 99 0 0 1 2 3");
  REQUIRE(zero);
  CHECK(zero->state == 'Z');
  CHECK(zero->rss_bytes == 0);
  auto one = parse_proc_stat("5 (a b) S 1 1 1 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 99 4096 1\n");
  REQUIRE(one);
  CHECK(one->rss_bytes == page_size_bytes());
  for (const char* bad : {"5 (w) S 1 1 1 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 99 4096 x 1",
                          "5 (w) S 1 1 1 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 99 4096 -3 1",
                          "5 (w) S 1 1 1 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 99 4096 "
                          "18446744073709551615 1"}) {  // pages * page size overflows
    INFO("text: " << bad);
    CHECK_FALSE(parse_proc_stat(bad));
  }
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
  CHECK(r->rss_bytes == 0);  // the line stops before rss
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
  CHECK(self->rss_bytes > 0);

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

TEST_CASE("the resident set size of a process holding 32 MiB", "[unit][launch][proc]") {
  constexpr std::size_t kBytes = 32u << 20;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) ::_exit(1);
    std::memset(p, 1, kBytes);  // touched: resident
    ::pause();
    ::_exit(0);
  }
  std::optional<ProcSample> s;
  for (int i = 0; i < 500; ++i) {  // until it touched its pages and sleeps (bounded: 5 s)
    s = sample_process(child);
    if (s && s->state == 'S' && s->rss_bytes >= kBytes) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(child, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(s);
  CHECK(s->rss_bytes >= kBytes);
  CHECK(s->rss_bytes % page_size_bytes() == 0);
}
