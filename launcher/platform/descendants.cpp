// Descendant tracking through /proc, freeze-then-kill of a subtree, reaping inherited orphans,
// and the watcher process that cleans up after a SIGKILLed agent (see descendants.hpp).
#include "ddp/launch/descendants.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>

namespace ddp::launch {
namespace {

using Clock = std::chrono::steady_clock;

std::string read_small(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

std::vector<pid_t> numeric_entries(const std::string& dir) {
  std::vector<pid_t> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    long v = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && v > 0) out.push_back(static_cast<pid_t>(v));
  }
  ::closedir(d);
  return out;
}

bool have_children_files() {
  static const bool have =
      ::access(("/proc/self/task/" + std::to_string(::getpid()) + "/children").c_str(), R_OK) == 0;
  return have;
}

// The children of `pid` (of each of its threads).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  const std::string base = "/proc/" + std::to_string(pid) + "/task/";
  for (pid_t tid : numeric_entries(base)) {
    const std::string text = read_small(base + std::to_string(tid) + "/children");
    const char* p = text.c_str();
    while (*p) {
      char* end = nullptr;
      long v = std::strtol(p, &end, 10);
      if (end == p) break;
      if (v > 0) out.push_back(static_cast<pid_t>(v));
      p = end;
    }
  }
  return out;
}

// parent -> children for every process, from a scan of /proc (kernels without children files).
std::multimap<pid_t, pid_t> scan_parents() {
  std::multimap<pid_t, pid_t> kids;
  for (pid_t pid : numeric_entries("/proc")) {
    ProcStat st;
    if (read_proc_stat(pid, st)) kids.emplace(st.ppid, pid);
  }
  return kids;
}

bool stopped_or_gone(const ProcId& p) {
  ProcStat st;
  if (!read_proc_stat(p.pid, st) || st.starttime != p.starttime) return true;
  return st.state == 'T' || st.state == 't' || st.state == 'Z' || st.state == 'X';
}

}  // namespace

bool read_proc_stat(pid_t pid, ProcStat& out) {
  const std::string text = read_small("/proc/" + std::to_string(pid) + "/stat");
  auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  const char* p = text.c_str() + close + 2;
  out.state = *p++;
  char* end = nullptr;
  out.ppid = static_cast<pid_t>(std::strtol(p, &end, 10));
  out.pgrp = static_cast<pid_t>(std::strtol(end, &end, 10));
  for (int field = 6; field < 22; ++field) std::strtoull(end, &end, 10);  // session..itrealvalue
  out.starttime = std::strtoull(end, &end, 10);
  return true;
}

std::vector<ProcId> descendants(pid_t root, pid_t exclude) {
  std::vector<ProcId> out;
  std::multimap<pid_t, pid_t> scanned;
  const bool by_files = have_children_files();
  if (!by_files) scanned = scan_parents();
  std::vector<pid_t> todo{root};
  while (!todo.empty() && out.size() < 1000000) {
    pid_t parent = todo.back();
    todo.pop_back();
    std::vector<pid_t> kids;
    if (by_files) {
      kids = children_of(parent);
    } else {
      auto [a, b] = scanned.equal_range(parent);
      for (auto it = a; it != b; ++it) kids.push_back(it->second);
    }
    for (pid_t k : kids) {
      ProcStat st;
      if (k == exclude || k == root || !read_proc_stat(k, st)) continue;
      out.push_back({k, st.starttime, st.pgrp});
      todo.push_back(k);
    }
  }
  return out;
}

int kill_tree(pid_t root, const std::vector<ProcId>& also, pid_t exclude) {
  const pid_t self = ::getpid();
  std::map<pid_t, std::uint64_t> victims;
  for (int pass = 0; pass < 32; ++pass) {
    std::vector<ProcId> found;
    if (root > 0) found = descendants(root, exclude);
    auto add_tree = [&](const ProcId& p) {
      ProcStat st;
      if (p.pid == exclude || !read_proc_stat(p.pid, st) || st.starttime != p.starttime) return;
      found.push_back(p);
      auto below = descendants(p.pid, exclude);
      found.insert(found.end(), below.begin(), below.end());
    };
    if (root <= 0) {  // no live root holds the tree together: walk from every known process
      for (const auto& p : also) add_tree(p);
      for (const auto& [pid, start] : victims) add_tree({pid, start});
    } else {
      for (const auto& p : also) add_tree(p);
    }
    std::vector<ProcId> fresh;
    for (const auto& p : found) {
      if (p.pid == self || p.pid == exclude) continue;
      if (victims.emplace(p.pid, p.starttime).second) fresh.push_back(p);
    }
    if (fresh.empty()) break;
    // Stopped processes cannot fork: the next pass sees every child they made.
    for (const auto& p : fresh) ::kill(p.pid, SIGSTOP);
    const auto deadline = Clock::now() + std::chrono::milliseconds(200);
    while (Clock::now() < deadline && !std::all_of(fresh.begin(), fresh.end(), stopped_or_gone)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  int killed = 0;
  for (const auto& [pid, start] : victims) {
    ProcStat st;
    if (read_proc_stat(pid, st) && st.starttime == start && st.state != 'Z') {
      ::kill(pid, SIGKILL);
      ++killed;
    }
  }
  return killed;
}

void signal_descendants(int sig, const std::vector<pid_t>& skip_pgrps, pid_t exclude) {
  for (const auto& p : descendants(::getpid(), exclude)) {
    ProcStat st;
    if (!read_proc_stat(p.pid, st) || st.starttime != p.starttime) continue;
    if (std::find(skip_pgrps.begin(), skip_pgrps.end(), st.pgrp) != skip_pgrps.end()) continue;
    ::kill(p.pid, sig);
  }
}

void reap_orphans(const std::vector<pid_t>& keep) {
  std::vector<pid_t> kids;
  if (have_children_files()) {
    kids = children_of(::getpid());
  } else {
    auto all = scan_parents();
    auto [a, b] = all.equal_range(::getpid());
    for (auto it = a; it != b; ++it) kids.push_back(it->second);
  }
  for (pid_t k : kids) {
    if (std::find(keep.begin(), keep.end(), k) != keep.end()) continue;
    int status = 0;
    while (::waitpid(k, &status, WNOHANG) < 0 && errno == EINTR) {
    }
  }
}

void become_subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }

namespace {

// The watcher: sits on the pipe's read end; every interval, records the agent's descendants;
// at EOF (the agent is gone, however it ended), kills what it recorded and what they started.
[[noreturn]] void watch(pid_t agent, int rfd) {
  int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd = 0; fd < 3; ++fd) {
    if (null_fd >= 0) ::dup2(null_fd, fd);
  }
  // Every fd but rfd; close_range(3, 2) would be EINVAL when rfd is 3 (and cost 4,000 closes).
  if ((rfd > 3 && ::syscall(SYS_close_range, 3U, static_cast<unsigned>(rfd) - 1, 0) != 0) ||
      ::syscall(SYS_close_range, static_cast<unsigned>(rfd) + 1, ~0U, 0) != 0) {
    for (int fd = 3; fd < 4096; ++fd) {
      if (fd != rfd) ::close(fd);
    }
  }
  for (int sig : {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE, SIGUSR1, SIGUSR2, SIGALRM, SIGXCPU,
                  SIGXFSZ, SIGVTALRM, SIGPROF, SIGPWR, SIGTTIN, SIGTTOU, SIGTSTP}) {
    ::signal(sig, SIG_IGN);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_NAME, "ddprun-watcher");
  const pid_t self = ::getpid();
  std::vector<ProcId> seen;
  auto interval = std::chrono::milliseconds(50);
  while (::getppid() == agent) {
    pollfd p{rfd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(interval.count()));
    if (r > 0) {
      char done = 0;
      // A byte: the agent ended normally and cleared its tree itself (stop_watcher). EOF: it
      // died (SIGKILL): clear what it left.
      if (::read(rfd, &done, 1) == 1) ::_exit(0);
      break;
    }
    if (r < 0 && errno != EINTR) break;
    const auto t0 = Clock::now();
    seen = descendants(agent, self);
    // A big tree costs more to walk: then walk less often (at most ~10% of a core).
    const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
    interval =
        std::clamp(took * 10, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
  }
  // The workers died with the agent (PR_SET_PDEATHSIG) and their children went to init: the
  // members of every recorded process group are found by a scan of /proc instead.
  std::vector<ProcId> leaders;
  for (const auto& p : seen) {
    if (p.pgrp == p.pid) leaders.push_back(p);
  }
  if (!leaders.empty()) {
    for (pid_t pid : numeric_entries("/proc")) {
      ProcStat st;
      if (pid == self || !read_proc_stat(pid, st)) continue;
      for (const auto& l : leaders) {
        if (st.pgrp == l.pid && st.starttime >= l.starttime) {
          seen.push_back({pid, st.starttime, st.pgrp});
          break;
        }
      }
    }
  }
  kill_tree(-1, seen, self);
  ::_exit(0);
}

}  // namespace

namespace {
// Overwrites the argument area (argv[0] .. the end of the last argument, contiguous) so that
// /proc/<pid>/cmdline names the watcher. The agent's own copy is untouched (fork: copy on write).
void rename_cmdline(int argc, char** argv) {
  if (argc <= 0 || argv == nullptr || argv[0] == nullptr) return;
  char* begin = argv[0];
  char* end = argv[argc - 1] + std::strlen(argv[argc - 1]);
  const char name[] = "ddprun-watcher";
  std::memset(begin, 0, static_cast<std::size_t>(end - begin));
  std::memcpy(begin, name, std::min(sizeof(name) - 1, static_cast<std::size_t>(end - begin)));
}
}  // namespace

pid_t start_watcher(int* pipe_fd, int argc, char** argv) {
  *pipe_fd = -1;
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return -1;
  const pid_t agent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(p[0]);
    ::close(p[1]);
    return -1;
  }
  if (pid == 0) {
    ::close(p[1]);
    rename_cmdline(argc, argv);
    watch(agent, p[0]);
  }
  ::close(p[0]);
  *pipe_fd = p[1];
  return pid;
}

void stop_watcher(pid_t watcher, int pipe_fd) {
  if (watcher <= 0) return;
  const char done = 1;
  (void)!::write(pipe_fd, &done, 1);  // "cleared already": the watcher exits without a pass
  ::close(pipe_fd);
  // Waits for it (up to 5 s) on its pidfd, so no zombie is left and no time is slept away.
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, watcher, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    while (::poll(&p, 1, 5000) < 0 && errno == EINTR) {
    }
    ::close(pidfd);
  }
  ::waitpid(watcher, nullptr, WNOHANG);
}

}  // namespace ddp::launch
