// WorkerGroup with real processes: exit codes and signals seen at once through pidfds, the
// grace period before SIGKILL, whole process groups stopped, exec failures named, and no worker
// outliving a SIGKILLed agent.
#include "ddp/launch/worker_group.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <thread>

#include "ddp/proto/error.hpp"

using namespace ddp::launch;
using namespace std::chrono_literals;

namespace {

WorkerSpec sh(const std::string& script) {
  return {{"/bin/sh", "-c", script}, {{"PATH", "/usr/bin:/bin"}}};
}

// True once `pid` is gone or a zombie (PID 1 here reaps orphans late).
bool gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

bool eventually_gone(pid_t pid, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (gone(pid)) return true;
    std::this_thread::sleep_for(10ms);
  }
  return gone(pid);
}

}  // namespace

TEST_CASE("exit codes and signals are reported per local rank", "[integration][launch]") {
  WorkerGroup g;
  g.start({sh("exec sleep 30"), sh("exit 3"), sh("exec sleep 30")});
  auto e = g.wait_any(10s);
  REQUIRE(e.has_value());
  CHECK(e->local_rank == 1);
  CHECK(e->exit_code == 3);
  CHECK(e->failed());
  CHECK(e->describe() == "3");
  CHECK(g.running() == 2);
  ::kill(g.pids()[2], SIGSEGV);
  e = g.wait_any(10s);
  REQUIRE(e.has_value());
  CHECK(e->local_rank == 2);
  CHECK(e->signal == SIGSEGV);
  CHECK(e->describe() == "Signal 11 (SIGSEGV)");
  auto rest = g.stop(5s);
  REQUIRE(rest.size() == 1);
  CHECK(rest[0].signal == SIGTERM);
}

TEST_CASE("wait_any times out when nobody exits", "[integration][launch]") {
  WorkerGroup g;
  g.start({sh("exec sleep 30")});
  CHECK_FALSE(g.wait_any(50ms).has_value());
}

TEST_CASE("environment and arguments reach the worker", "[integration][launch]") {
  WorkerGroup g;
  WorkerSpec s{{"/bin/sh", "-c", "test \"$RANK\" = 7 && test \"$1\" = arg", "sh", "arg"},
               {{"RANK", "7"}}};
  g.start({s});
  auto e = g.wait_any(10s);
  REQUIRE(e.has_value());
  CHECK(e->exit_code == 0);
}

TEST_CASE("a worker ignoring SIGTERM is killed after the grace period", "[integration][launch]") {
  char dir[] = "/tmp/ddp-wg-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  std::string ready = std::string(dir) + "/ready";
  WorkerGroup g;
  g.start({sh("trap '' TERM; : > " + ready + "; while :; do sleep 0.05; done")});
  for (int i = 0; i < 500 && ::access(ready.c_str(), F_OK) != 0; ++i) {
    std::this_thread::sleep_for(10ms);  // until the shell has installed its trap
  }
  REQUIRE(::access(ready.c_str(), F_OK) == 0);
  auto exits = g.stop(300ms);
  REQUIRE(exits.size() == 1);
  CHECK(exits[0].signal == SIGKILL);  // it outlived SIGTERM; the grace ran out
  std::remove(ready.c_str());
  ::rmdir(dir);
}

TEST_CASE("stopping a worker stops its whole process group", "[integration][launch]") {
  char dir[] = "/tmp/ddp-wg-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  std::string pidfile = std::string(dir) + "/grandchild";
  WorkerGroup g;
  g.start({sh("sleep 30 & echo $! > " + pidfile + ".tmp; mv " + pidfile + ".tmp " + pidfile +
              "; wait")});
  pid_t grandchild = 0;
  for (int i = 0; i < 500 && grandchild == 0; ++i) {
    std::ifstream(pidfile) >> grandchild;
    if (grandchild == 0) std::this_thread::sleep_for(10ms);
  }
  REQUIRE(grandchild > 0);
  g.stop(2s);
  CHECK(eventually_gone(grandchild, 2s));
  std::remove(pidfile.c_str());
  ::rmdir(dir);
}

TEST_CASE("a program that cannot be executed is named in the error", "[integration][launch]") {
  WorkerGroup g;
  try {
    g.start({sh("exec sleep 30"), {{"/nonexistent/train"}, {}}});
    FAIL("start should throw");
  } catch (const ddp::ConfigError& e) {
    CHECK_THAT(e.what(), Catch::Contains("cannot execute '/nonexistent/train' for local rank 1"));
    CHECK_THAT(e.what(), Catch::Contains("No such file"));
  }
  CHECK(g.running() == 0);  // rank 0 was stopped again
}

TEST_CASE("workers die with a SIGKILLed agent", "[integration][launch]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t agent = ::fork();
  REQUIRE(agent >= 0);
  if (agent == 0) {  // the "agent": start two workers, report their pids, wait to be killed
    ::close(fds[0]);
    WorkerGroup g;
    g.start({sh("exec sleep 30"), sh("exec sleep 30")});
    auto pids = g.pids();
    (void)!::write(fds[1], pids.data(), pids.size() * sizeof(pid_t));
    ::pause();
    ::_exit(0);
  }
  ::close(fds[1]);
  pid_t workers[2] = {0, 0};
  REQUIRE(::read(fds[0], workers, sizeof(workers)) == static_cast<ssize_t>(sizeof(workers)));
  ::close(fds[0]);
  ::kill(agent, SIGKILL);
  ::waitpid(agent, nullptr, 0);
  CHECK(eventually_gone(workers[0], 1s));
  CHECK(eventually_gone(workers[1], 1s));
}
