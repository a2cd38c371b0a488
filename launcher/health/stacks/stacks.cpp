// Stacks of live workers through py-spy and eu-stack (see stacks.hpp): the two parsers and the
// bounded tool runs (posix_spawn, stdin /dev/null, stdout and stderr on pipes read up to a cap,
// SIGKILL through a pidfd at the deadline). The store's JSON is in stack_merge.cpp.
#include "ddp/launch/stacks.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "ddp/proto/error.hpp"
#include "stack_text.hpp"

extern char** environ;

namespace ddp::launch {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using stack_text::clip;
using stack_text::json_string;
using namespace std::string_literals;

constexpr std::size_t kMaxToolOutput = 4u << 20;  // per stream; the rest is read and dropped
constexpr std::size_t kMaxParallel = 16;          // tool runs at once

// Moves the main thread to the front (the report and the store keep it first).
std::vector<ThreadStack> main_first(std::vector<ThreadStack> threads) {
  std::stable_partition(threads.begin(), threads.end(),
                        [](const ThreadStack& t) { return t.main; });
  return threads;
}

long long json_int(const json& j, const char* key, long long fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<long long>() : fallback;
}

// "clock_nanosleep@GLIBC_2.2.5" -> "clock_nanosleep" (the version tag says nothing about the call).
std::string strip_symbol_version(std::string s) {
  const auto at = s.find('@');
  if (at == std::string::npos || at == 0) return s;
  const auto tag = s.find_first_not_of('@', at);
  if (tag == std::string::npos) return s;
  const bool plain = std::all_of(s.begin() + static_cast<std::ptrdiff_t>(tag), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
  });
  return plain ? s.substr(0, at) : s;
}

std::string trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  const auto e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

}  // namespace

std::vector<ThreadStack> parse_py_spy_json(std::string_view text) {
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    throw ProtocolError("py-spy --json: not JSON (" + clip(std::string(text), 80) + ")");
  }
  if (!j.is_array()) throw ProtocolError("py-spy --json: not a JSON array of threads");
  std::vector<ThreadStack> out;
  int main_at = -1, named_main = -1;
  for (const auto& t : j) {
    if (!t.is_object()) throw ProtocolError("py-spy --json: a thread is not an object");
    ThreadStack ts;
    ts.name = json_string(t, "thread_name");
    const long long tid = json_int(t, "os_thread_id", -1);
    if (ts.name.empty()) ts.name = "thread " + std::to_string(tid);
    if (tid > 0 && tid == json_int(t, "pid", -2) && main_at < 0) {
      main_at = static_cast<int>(out.size());
    }
    if (ts.name == "MainThread" && named_main < 0) named_main = static_cast<int>(out.size());
    auto frames = t.find("frames");
    if (frames != t.end() && !frames->is_array()) {
      throw ProtocolError("py-spy --json: 'frames' is not an array");
    }
    if (frames != t.end()) {
      for (const auto& f : *frames) {
        if (!f.is_object()) throw ProtocolError("py-spy --json: a frame is not an object");
        Frame fr;
        fr.function = json_string(f, "name");
        fr.file = json_string(f, "short_filename");
        if (fr.file.empty()) fr.file = json_string(f, "filename");
        fr.line = static_cast<int>(json_int(f, "line", 0));
        ts.frames.push_back(std::move(fr));
      }
    }
    out.push_back(std::move(ts));
  }
  const int m = main_at >= 0 ? main_at : named_main >= 0 ? named_main : 0;
  if (!out.empty()) out[static_cast<std::size_t>(m)].main = true;
  return main_first(std::move(out));
}

std::vector<ThreadStack> parse_eu_stack(std::string_view text, pid_t pid) {
  std::vector<ThreadStack> out;
  std::istringstream in{std::string(text)};
  bool any_main = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("TID ", 0) == 0 && !line.empty() && trim(line).back() == ':') {
      const std::string tid = trim(std::string_view(line).substr(4, line.find(':') - 4));
      ThreadStack t;
      t.name = "TID " + tid;
      t.main = !any_main && tid == std::to_string(pid);
      any_main = any_main || t.main;
      out.push_back(std::move(t));
      continue;
    }
    if (out.empty() || line.empty() || line[0] != '#') continue;  // "PID n - process", -s lines
    std::istringstream words(line.substr(1));
    std::string index, address;
    if (!(words >> index >> address) || address.rfind("0x", 0) != 0) continue;
    std::string rest;
    std::getline(words, rest);
    Frame f;
    f.function = strip_symbol_version(trim(rest));
    if (f.function.empty()) f.function = "??";
    out.back().frames.push_back(std::move(f));
  }
  if (!any_main && !out.empty()) out.front().main = true;
  return main_first(std::move(out));
}

const std::vector<Frame>& main_frames(const ProcessStacks& p) {
  static const std::vector<Frame> none;
  for (const auto& t : p.threads) {
    if (t.main) return t.frames;
  }
  return none;
}

namespace {

struct ToolRun {
  bool started = false;
  bool timed_out = false;
  int status = -1;  // the exit status; -1 when unknown (killed, or reaped by someone else)
  std::string out, err, spawn_error;
};

std::string find_on_path(const std::string& name, const std::string& path_var) {
  std::istringstream dirs(path_var);
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;  // "" would mean the agent's working directory: never
    const std::string cand = dir + "/" + name;
    struct stat st {};
    if (::stat(cand.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(cand.c_str(), X_OK) == 0) {
      return cand;
    }
  }
  return {};
}

// Waits for `pid` to end until `deadline` (none when `kill_now`), then SIGKILLs it (through its
// pidfd, so a pid another thread has reaped and the kernel reused is never hit) and reaps it
// when it can.
void finish(pid_t pid, int pidfd, Clock::time_point deadline, bool kill_now, ToolRun& r) {
  auto exited = [&](Clock::time_point until) {
    for (;;) {
      int st = 0;
      const pid_t w = ::waitpid(pid, &st, WNOHANG);
      if (w == pid) {
        if (WIFEXITED(st) && !r.timed_out) r.status = WEXITSTATUS(st);
        return true;
      }
      if (w < 0 && errno != EINTR) return true;  // ECHILD: the agent's orphan reaper got it
      const auto now = Clock::now();
      if (now >= until) return false;
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
      if (pidfd >= 0) {
        pollfd p{pidfd, POLLIN, 0};
        ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 100)));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
  };
  if (!kill_now && exited(deadline)) return;
  r.timed_out = true;
  if (pidfd >= 0) {
    ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
  } else {
    ::kill(pid, SIGKILL);
  }
  exited(Clock::now() + std::chrono::seconds(1));  // else a zombie the orphan reaper takes
}

// Runs `exe args...` with no stdin and no inherited fds, reading its output (each stream up
// to kMaxToolOutput) until it ends or `timeout` passes.
ToolRun run_tool(const std::string& exe, const std::vector<std::string>& args,
                 std::chrono::milliseconds timeout) {
  ToolRun r;
  int out[2] = {-1, -1}, err[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    r.spawn_error = std::string("pipe: ") + std::strerror(errno);
    for (int fd : {out[0], out[1]}) ::close(fd);  // close(-1) is a harmless EBADF
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&fa, err[1], STDERR_FILENO);
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);  // the agent blocks signals for its signalfds
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);  // a terminal's Ctrl-C is the agent's to handle
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  std::vector<char*> argv{const_cast<char*>(exe.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, exe.c_str(), &fa, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    r.spawn_error = std::strerror(rc);
    ::close(out[0]);
    ::close(err[0]);
    return r;
  }
  r.started = true;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  const auto deadline = Clock::now() + timeout;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  std::string* bufs[2] = {&r.out, &r.err};
  int open_fds = 2;
  char chunk[65536];
  while (open_fds > 0) {
    const auto now = Clock::now();
    if (now >= deadline) break;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    const int n = ::poll(fds, 2, static_cast<int>(left));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2 && n > 0; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t got = ::read(fds[i].fd, chunk, sizeof(chunk));
      if (got > 0) {
        auto& b = *bufs[i];
        const auto room = kMaxToolOutput - std::min(kMaxToolOutput, b.size());
        b.append(chunk, std::min(room, static_cast<std::size_t>(got)));
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  finish(pid, pidfd, deadline, /*kill_now=*/open_fds > 0, r);  // output still open: too slow
  for (auto& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  if (pidfd >= 0) ::close(pidfd);
  return r;
}

std::string read_line_of(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// Why a run gave no stack, in a few words for the report.
std::string why_failed(const ToolRun& r, std::chrono::milliseconds timeout) {
  if (!r.started) return "could not start (" + r.spawn_error + ")";
  if (r.timed_out) return "timed out after " + std::to_string(timeout.count()) + " ms";
  const std::string& e = r.err.empty() ? r.out : r.err;
  auto has = [&](const char* s) { return e.find(s) != std::string::npos; };
  if (has("Failed to find python version")) return "not a Python process";
  if (has("ermission denied") || has("ermission Denied") || has("Operation not permitted")) {
    const std::string scope = read_line_of("/proc/sys/kernel/yama/ptrace_scope");
    return scope.empty() ? "permission denied" : "permission denied (ptrace_scope=" + scope + ")";
  }
  std::istringstream lines(e);
  for (std::string line; std::getline(lines, line);) {
    line = trim(line);
    if (line.rfind("Error: ", 0) == 0) line = line.substr(7);
    if (!line.empty()) return clip(line, 200);
  }
  return "exit status " + std::to_string(r.status) + " and no stack";
}

// A tool killed while it held the target under ptrace can leave it stopped: resume it.
void resume_if_stopped(pid_t pid) {
  const std::string stat = read_line_of("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  if (paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T') {
    ::kill(pid, SIGCONT);
  }
}

bool has_frames(const std::vector<ThreadStack>& threads) {
  return std::any_of(threads.begin(), threads.end(),
                     [](const ThreadStack& t) { return !t.frames.empty(); });
}

// One tool on one pid: its threads, or why none.
std::vector<ThreadStack> attempt(const std::string& tool, const std::string& exe, pid_t pid,
                                 std::chrono::milliseconds timeout, std::string& why) {
  if (exe.empty()) {
    why = "not found on PATH";
    return {};
  }
  const bool py = tool == "py-spy";
  const std::string p = std::to_string(pid);
  const ToolRun r = run_tool(
      exe, py ? std::vector<std::string>{"dump", "--pid", p, "--json"} : std::vector{"-p"s, p},
      timeout);
  if (r.timed_out) resume_if_stopped(pid);
  std::vector<ThreadStack> threads;
  if (r.started && !r.timed_out && py) {
    try {
      threads = parse_py_spy_json(r.out);
    } catch (const ProtocolError&) {  // its error text instead: why_failed reads it
    }
  } else if (r.started && !r.timed_out) {
    // eu-stack exits 1 when one thread fails to unwind: what it printed still counts.
    threads = parse_eu_stack(r.out, pid);
    for (auto& t : threads) {  // "TID 123" -> "gloo_tcp_loop (TID 123)"
      const std::string comm = read_line_of("/proc/" + p + "/task/" + t.name.substr(4) + "/comm");
      if (!comm.empty()) t.name = comm + " (" + t.name + ")";
    }
  }
  if (has_frames(threads)) return threads;
  const bool quiet = r.started && !r.timed_out && r.status == 0 && r.err.empty();
  why = quiet ? "no stack in its output" : why_failed(r, timeout);
  return {};
}

ProcessStacks stacks_of(pid_t pid, const std::string& py_spy, const std::string& eu_stack,
                        std::chrono::milliseconds timeout) {
  ProcessStacks p;
  p.pid = pid;
  struct stat st {};
  if (::stat(("/proc/" + std::to_string(pid)).c_str(), &st) != 0) {
    p.error = "process gone";
    return p;
  }
  for (const std::string tool : {"py-spy", "eu-stack"}) {
    std::string why;
    p.threads = attempt(tool, tool == "py-spy" ? py_spy : eu_stack, pid, timeout, why);
    if (why.empty()) {
      p.tool = tool;
      p.error.clear();
      return p;
    }
    p.error += (p.error.empty() ? "" : "; ") + tool + ": " + why;
  }
  return p;
}

}  // namespace

std::vector<ProcessStacks> take_stacks(const std::vector<pid_t>& pids, const std::string& path_var,
                                       std::chrono::milliseconds timeout) {
  const std::string py_spy = find_on_path("py-spy", path_var);
  const std::string eu_stack = find_on_path("eu-stack", path_var);
  std::vector<ProcessStacks> out(pids.size());
  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t i; (i = next.fetch_add(1)) < pids.size();) {
      try {
        out[i] = stacks_of(pids[i], py_spy, eu_stack, timeout);
      } catch (const std::exception& e) {
        out[i].pid = pids[i];
        out[i].error = e.what();
      }
    }
  };
  std::vector<std::thread> threads;
  const std::size_t n = std::min(pids.size(), kMaxParallel);
  for (std::size_t k = 1; k < n; ++k) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace ddp::launch
