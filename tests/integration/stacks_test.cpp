// Stacks of real processes with the tools on PATH (skipped visibly without them): py-spy finds
// a Python function of a sleeping interpreter, eu-stack a nanosleep frame of `sleep 30`. Then
// fake tools (shell scripts in a temporary folder put first on PATH) pin the rest down without
// either tool: fallback to eu-stack, timeouts that kill the tool, endless output, errors named,
// many pids in parallel, and a PATH with neither tool.
#include "ddp/launch/stacks.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include "support/skip.hpp"
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

extern char** environ;

using namespace ddp::launch;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// A child of this test, SIGKILLed and reaped at scope exit; its stdout on a pipe.
struct Child {
  pid_t pid = -1;
  int out = -1;
  explicit Child(const std::vector<std::string>& argv) {
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const int rc = ::posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(p[1]);
    out = p[0];
    REQUIRE(rc == 0);
  }
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (out >= 0) ::close(out);
  }
  // The first line of stdout, waiting at most `limit`.
  std::string line(std::chrono::milliseconds limit) {
    std::string got;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (got.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{out, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(out, buf, sizeof(buf));
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    return got.substr(0, got.find('\n'));
  }
};

std::string venv_bin() {
  const char* venv = std::getenv("DDP_TORCH_VENV");
  const char* home = std::getenv("HOME");
  const std::string root =
      venv ? venv : std::string(home ? home : "/root") + "/.cache/ddprun/torch-venv";
  return root + "/bin";
}

bool executable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

bool has_frame(const ProcessStacks& p, const std::string& part) {
  const auto& frames = main_frames(p);
  return std::any_of(frames.begin(), frames.end(),
                     [&](const Frame& f) { return f.function.find(part) != std::string::npos; });
}

// A temporary folder of fake tools, removed at scope exit.
struct FakeTools {
  std::string dir;
  FakeTools() {
    char tmpl[] = "/tmp/ddp-stacks-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir = tmpl;
  }
  ~FakeTools() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  void add(const std::string& name, const std::string& body) {
    const std::string path = dir + "/" + name;
    std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
    REQUIRE(::chmod(path.c_str(), 0755) == 0);
  }
  // Only the fakes: the scripts themselves find sleep and yes on the test's own PATH.
  std::string path() const { return dir; }
};

// The eu-stack text of one thread whose TID is the pid the script is given ($2 of -p PID).
const char* kFakeEuStack =
    "echo \"PID $2 - process\"; echo \"TID $2:\"\n"
    "echo '#0  0x00007fc429d8f545 clock_nanosleep@GLIBC_2.2.5'\n"
    "echo '#1  0x00005591abf1d17a inner'\n"
    "echo '#2  0x00005591abf1d1b3 main'";

}  // namespace

TEST_CASE("py-spy: a sleeping interpreter's Python frames", "[launch][integration]") {
  const std::string python = venv_bin() + "/python";
  if (!executable(python) || !executable(venv_bin() + "/py-spy")) {
    DDP_SKIP_TOOL("no " << python << " or py-spy next to it (scripts/setup.sh --with-torch)");
  }
  Child py({python, "-c",
            "import time\n"
            "def stuck_here():\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(30)\n"
            "stuck_here()\n"});
  REQUIRE(py.line(20s) == "ready");
  const auto s = take_stacks({py.pid}, venv_bin() + ":/usr/bin:/bin", 10s);
  REQUIRE(s.size() == 1);
  INFO(s[0].error);
  CHECK(s[0].pid == py.pid);
  CHECK(s[0].tool == "py-spy");
  CHECK(s[0].error.empty());
  CHECK(has_frame(s[0], "stuck_here"));
  CHECK(has_frame(s[0], "<module>"));
  CHECK(main_frames(s[0]).at(0).file == "<string>");
}

TEST_CASE("eu-stack: native frames of sleep, after py-spy says it is not Python",
          "[launch][integration]") {
  if (!executable("/usr/bin/eu-stack")) {
    DDP_SKIP_TOOL("no /usr/bin/eu-stack (Debian's elfutils)");
  }
  Child sl({"sleep", "30"});
  // posix_spawnp returns once exec succeeded: the pid runs coreutils' sleep.
  const auto s = take_stacks({sl.pid}, venv_bin() + ":/usr/bin:/bin", 10s);
  REQUIRE(s.size() == 1);
  INFO(s[0].error);
  CHECK(s[0].tool == "eu-stack");
  CHECK(s[0].error.empty());
  CHECK(has_frame(s[0], "nanosleep"));
  REQUIRE(!s[0].threads.empty());
  CHECK(s[0].threads[0].main);
  CHECK(s[0].threads[0].name == "sleep (TID " + std::to_string(sl.pid) + ")");
}

TEST_CASE("stacks: neither tool on PATH, and a pid that is gone", "[launch][integration]") {
  auto s = take_stacks({::getpid()}, "/nonexistent-ddp-dir::", 1s);
  REQUIRE(s.size() == 1);
  CHECK(s[0].tool.empty());
  CHECK(s[0].threads.empty());
  CHECK(s[0].error == "py-spy: not found on PATH; eu-stack: not found on PATH");

  pid_t gone = -1;
  {
    Child c({"true"});
    REQUIRE(::waitpid(c.pid, nullptr, 0) == c.pid);
    gone = c.pid;
    c.pid = -1;
  }
  s = take_stacks({gone}, "/usr/bin:/bin", 1s);
  CHECK(s.at(0).error == "process gone");
}

TEST_CASE("stacks: a tool past its timeout is killed, the other is tried",
          "[launch][integration]") {
  FakeTools fake;
  fake.add("py-spy", "echo $$ > " + fake.dir + "/tool.pid\nexec sleep 30");
  auto s = take_stacks({::getpid()}, fake.path(), 300ms);
  REQUIRE(s.size() == 1);
  CHECK(s[0].error == "py-spy: timed out after 300 ms; eu-stack: not found on PATH");
  // The tool was SIGKILLed and reaped: its pid names no process of ours any more.
  std::string tool_pid;
  std::ifstream(fake.dir + "/tool.pid") >> tool_pid;
  REQUIRE(!tool_pid.empty());
  CHECK(::waitpid(std::stoi(tool_pid), nullptr, WNOHANG) == -1);
  CHECK(errno == ECHILD);

  // Endless output: read up to the cap, then killed at the deadline.
  fake.add("py-spy", "exec yes");
  fake.add("eu-stack",
           "echo 'eu-stack: dwfl_linux_proc_attach pid 5: Operation not permitted' >&2; exit 1");
  s = take_stacks({::getpid()}, fake.path(), 300ms);
  INFO(s.at(0).error);
  CHECK(s.at(0).error.rfind("py-spy: timed out after 300 ms; eu-stack: permission denied", 0) == 0);
}

TEST_CASE("stacks: not Python, then eu-stack's frames", "[launch][integration]") {
  FakeTools fake;
  fake.add("py-spy",
           "echo 'Error: Failed to find python version from target process' >&2\n"
           "echo 'Stack backtrace:' >&2; exit 1");
  fake.add("eu-stack", kFakeEuStack);
  auto s = take_stacks({::getpid()}, fake.path(), 5s);
  REQUIRE(s.size() == 1);
  CHECK(s[0].tool == "eu-stack");
  CHECK(s[0].error.empty());
  REQUIRE(main_frames(s[0]).size() == 3);
  CHECK(main_frames(s[0])[0].function == "clock_nanosleep");
  CHECK(main_frames(s[0])[1].function == "inner");
  const std::string tid = "(TID " + std::to_string(::getpid()) + ")";
  CHECK(s[0].threads[0].name.find(tid) != std::string::npos);

  fake.add("eu-stack", "echo 'eu-stack: something odd' >&2; exit 1");
  s = take_stacks({::getpid()}, fake.path(), 5s);
  CHECK(s.at(0).error == "py-spy: not a Python process; eu-stack: eu-stack: something odd");
}

TEST_CASE("stacks: many pids at once, each result at its pid's place", "[launch][integration]") {
  FakeTools fake;
  // py-spy's JSON naming the pid it was given ($3 of dump --pid P --json).
  fake.add("py-spy",
           "echo \"[{\\\"pid\\\": $3, \\\"thread_name\\\": \\\"T$3\\\", \\\"os_thread_id\\\": $3, "
           "\\\"frames\\\": [{\\\"name\\\": \\\"f$3\\\", \\\"short_filename\\\": \\\"x.py\\\", "
           "\\\"line\\\": 1}]}]\"");
  std::vector<std::unique_ptr<Child>> kids;
  std::vector<pid_t> pids;
  for (int i = 0; i < 24; ++i) {
    kids.push_back(std::make_unique<Child>(std::vector<std::string>{"sleep", "30"}));
    pids.push_back(kids.back()->pid);
  }
  const auto s = take_stacks(pids, fake.path(), 5s);
  REQUIRE(s.size() == pids.size());
  for (std::size_t i = 0; i < pids.size(); ++i) {
    INFO(i << ": " << s[i].error);
    CHECK(s[i].pid == pids[i]);
    CHECK(s[i].tool == "py-spy");
    REQUIRE(main_frames(s[i]).size() == 1);
    CHECK(main_frames(s[i])[0].function == "f" + std::to_string(pids[i]));
  }
}
