// WorkerGroup with real processes: exit codes and signals seen at once through pidfds, the
// grace period before SIGKILL, whole process groups stopped, exec failures named, no worker
// outliving a SIGKILLed agent, workers inheriting no fd but 0-2 and the agent's inherited ones,
// kill_tree reaching setsid'ed and double-forked descendants, and each worker of spawn_workers
// writing to a progress pipe of its own (DDPRUN_PROGRESS_FD) that no sibling holds.
#include "ddp/launch/worker_group.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "ddp/launch/descendants.hpp"
#include "ddp/launch/round_workers.hpp"
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

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s;
}

// Waits for `path` to hold a complete line (the writer renames it into place).
std::string wait_for_file(const std::string& path) {
  for (int i = 0; i < 1000 && ::access(path.c_str(), F_OK) != 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  return read_file(path);
}

}  // namespace

TEST_CASE("a worker gets fds 0-2 and the inherited ones, nothing else", "[integration][launch]") {
  char dir[] = "/tmp/ddp-wg-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  int leaked[2], passed[2];
  REQUIRE(::pipe(leaked) == 0);  // not close-on-exec: what a careless library leaves open
  REQUIRE(::pipe(passed) == 0);
  const std::string out = std::string(dir) + "/fds";
  {
    WorkerGroup g({{passed[1]}, -1});
    // The fds still open once the listing's own directory fd is closed again (no pipeline and
    // no redirection while listing: the shell would hold fds of its own for those).
    g.start(
        {sh("l=; for f in /proc/$$/fd/*; do [ -e \"$f\" ] && l=\"$l ${f##*/}\"; done; echo $l > " +
            out + ".tmp; mv " + out + ".tmp " + out)});
    auto e = g.wait_any(10s);
    REQUIRE(e.has_value());
    CHECK(e->exit_code == 0);
  }
  std::stringstream listed(wait_for_file(out));
  std::vector<int> fds;
  for (int fd; listed >> fd;) fds.push_back(fd);
  std::sort(fds.begin(), fds.end());
  CHECK(fds == std::vector<int>{0, 1, 2, passed[1]});
  for (int fd : {leaked[0], leaked[1], passed[0], passed[1]}) ::close(fd);
  std::remove(out.c_str());
  ::rmdir(dir);
}

TEST_CASE("kill_tree reaches forked, double-forked and setsid'ed descendants",
          "[integration][launch]") {
  char dir[] = "/tmp/ddp-wg-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string out = std::string(dir) + "/pids";
  become_subreaper();  // as the agent is: orphans stay below this process
  WorkerGroup g;
  g.start({sh("sleep 30 & a=$!; (sleep 30 & echo $! > " + out + ".b); setsid sleep 30 & c=$!; " +
              "b=$(cat " + out + ".b); echo $a $b $c > " + out + ".tmp; mv " + out + ".tmp " + out +
              "; exec sleep 30")});
  std::stringstream pids(wait_for_file(out));
  std::vector<pid_t> grandchildren;
  for (pid_t p; pids >> p;) grandchildren.push_back(p);
  REQUIRE(grandchildren.size() == 3);
  auto below = descendants(::getpid());
  for (pid_t p : grandchildren) {
    CHECK(std::any_of(below.begin(), below.end(), [&](const ProcId& d) { return d.pid == p; }));
  }
  g.stop(2s);
  CHECK_FALSE(gone(grandchildren[2]));  // the setsid'ed one is outside the worker's group
  CHECK(kill_tree(::getpid()) >= 1);
  for (pid_t p : grandchildren) CHECK(eventually_gone(p, 2s));
  reap_orphans({});
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  std::remove((out + ".b").c_str());
  std::remove(out.c_str());
  ::rmdir(dir);
}

TEST_CASE("spawn_workers gives each worker its own progress pipe", "[integration][launch]") {
  namespace fs = std::filesystem;
  // fd number -> what it is ("pipe:[inode]", ...) for a process.
  auto fd_links = [](pid_t pid) {
    std::map<int, std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
      auto target = fs::read_symlink(e.path(), ec);
      if (!ec) out[std::stoi(e.path().filename().string())] = target.string();
    }
    return out;
  };
  auto env_of = [](pid_t pid, const std::string& name) {
    std::stringstream all(read_file("/proc/" + std::to_string(pid) + "/environ"));
    for (std::string kv; std::getline(all, kv, '\0');) {
      if (kv.rfind(name + "=", 0) == 0) return kv.substr(name.size() + 1);
    }
    return std::string();
  };
  LaunchConfig config;
  config.no_python = true;
  config.entrypoint = "/bin/bash";  // dash's >&N takes one digit only
  config.args = {"-c",
                 "if [ \"$LOCAL_RANK\" = 0 ]; then echo step=3 >&$DDPRUN_PROGRESS_FD; fi; "
                 "exec sleep 30"};
  GroupInfo group;
  group.local_world_size = group.world_size = group.role_world_size = 2;
  const EnvMap agent_env{{"PATH", "/usr/bin:/bin"}};
  int sig[2];
  REQUIRE(::pipe2(sig, O_CLOEXEC) == 0);  // a stop signal that never comes
  OutputPump pump;
  ProgressReader progress;
  WorkerGroup workers;
  SpawnPlan plan{config, group, agent_env, "", "localhost", 2};
  plan.progress = &progress;
  const auto result = spawn_workers(plan, pump, workers, sig[0]);
  REQUIRE(result.error.empty());
  REQUIRE_FALSE(result.stop_signal);
  REQUIRE(workers.pids().size() == 2);
  REQUIRE(progress.fds().size() == 2);

  // Rank 0's line reaches the reader.
  for (int i = 0; i < 100 && progress.ranks().at(0).step != 3; ++i) {
    std::vector<pollfd> p;
    for (int fd : progress.fds()) p.push_back({fd, POLLIN, 0});
    REQUIRE(::poll(p.data(), p.size(), 100) >= 0);
    for (const auto& q : p) {
      if (q.revents != 0) progress.on_readable(q.fd, std::chrono::steady_clock::now());
    }
  }
  CHECK(progress.ranks().at(0).step == 3);
  CHECK(progress.ranks().at(0).reported);
  CHECK_FALSE(progress.ranks().at(1).reported);

  // Until both workers have become `sleep` (the fork, bash's exec, then bash's own exec), /proc
  // shows the forked agent's environment and fds, or nothing while an exec is under way (a race
  // under load; under TSan a fork and exec took over 5 s). Read them once both are asleep.
  for (int i = 0; i < 400; ++i) {
    bool both = true;
    for (pid_t pid : workers.pids()) {
      both = both && read_file("/proc/" + std::to_string(pid) + "/comm") == "sleep\n" &&
             !env_of(pid, "DDPRUN_PROGRESS_FD").empty();
    }
    if (both) break;
    std::this_thread::sleep_for(50ms);
  }
  // Each worker holds its own write end and not its sibling's; the agent holds read ends only.
  const auto self = fd_links(::getpid());
  std::string pipe_of[2];
  std::map<int, std::string> links[2];
  for (int r = 0; r < 2; ++r) {
    const pid_t pid = workers.pids()[static_cast<std::size_t>(r)];
    const std::string fd = env_of(pid, "DDPRUN_PROGRESS_FD");
    REQUIRE_FALSE(fd.empty());
    links[r] = fd_links(pid);
    REQUIRE(links[r].count(std::stoi(fd)) == 1);
    pipe_of[r] = links[r].at(std::stoi(fd));
    CHECK(pipe_of[r].rfind("pipe:[", 0) == 0);
    CHECK(std::count_if(self.begin(), self.end(),
                        [&](const auto& l) { return l.second == pipe_of[r]; }) == 1);
  }
  CHECK(pipe_of[0] != pipe_of[1]);
  for (int r = 0; r < 2; ++r) {
    INFO("local rank " << r << " fds");
    for (const auto& [fd, target] : links[r]) CHECK(target != pipe_of[1 - r]);
  }

  // Once the workers are gone, the pipes end: nobody else holds a write end.
  workers.stop(5s);
  for (int i = 0; i < 100 && !progress.fds().empty(); ++i) {
    std::vector<pollfd> p;
    for (int fd : progress.fds()) p.push_back({fd, POLLIN, 0});
    REQUIRE(::poll(p.data(), p.size(), 100) >= 0);
    for (const auto& q : p) {
      if (q.revents != 0) progress.on_readable(q.fd, std::chrono::steady_clock::now());
    }
  }
  CHECK(progress.fds().empty());
  CHECK(progress.ranks().at(0).step == 3);
  ::close(sig[0]);
  ::close(sig[1]);
}
