// Spawning and reaping workers. fork+exec from the agent's main thread: the child joins a new
// process group, asks for SIGKILL when its parent dies, closes every fd but 0-2 and ddprun's
// inherited ones (close_range), applies its --numa-binding (sched_setaffinity, set_mempolicy
// with masks built before fork), and reports an exec failure through a close-on-exec pipe.
// Exits are read from pidfds with poll(), so no exit waits for a timer.
#include "ddp/launch/worker_group.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <linux/mempolicy.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include "ddp/launch/numa_binding.hpp"
#include "ddp/proto/error.hpp"

namespace ddp::launch {
namespace {

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

const char* signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? abbrev : "?";
}

// Closes every fd >= 3 but those in `keep` (sorted, each >= 3). Async-signal-safe.
void close_fds_except(const std::vector<int>& keep, int fallback_max) {
  auto close_from_to = [fallback_max](unsigned lo, unsigned hi) {
    if (::syscall(SYS_close_range, lo, hi, 0) == 0) return;
    for (unsigned fd = lo; fd <= hi && fd < static_cast<unsigned>(fallback_max); ++fd) {
      ::close(static_cast<int>(fd));
    }
  };
  unsigned lo = 3;
  for (int k : keep) {
    const auto fd = static_cast<unsigned>(k);
    if (fd < lo) continue;
    if (fd > lo) close_from_to(lo, fd - 1);
    lo = fd + 1;
  }
  close_from_to(lo, ~0U);
}

struct ChildSetup {
  pid_t parent;
  int err_fd, out_fd, errout_fd;
  const std::vector<int>* keep;  // sorted, err_fd included
  int fallback_max;              // the highest fd to close one by one without close_range
  long long nofile_soft;
  const std::vector<unsigned long>* cpu_mask;  // empty: keep the agent's CPUs
  const std::vector<unsigned long>* mem_mask;  // empty: keep the default memory policy
  int keep_fd;                                 // in keep too; its FD_CLOEXEC is cleared
  int control_fd;                              // the same
};

// A bit mask of `bits` as the kernel's affinity and mempolicy calls take it; {} for none.
std::vector<unsigned long> kernel_mask(const std::vector<int>& bits) {
  std::vector<unsigned long> mask;
  constexpr int kWord = 8 * sizeof(unsigned long);
  for (int b : bits) {
    if (b < 0) continue;
    const auto word = static_cast<std::size_t>(b / kWord);
    if (mask.size() <= word) mask.resize(word + 1, 0);
    mask[word] |= 1UL << (b % kWord);
  }
  return mask;
}

// Runs in the child between fork and exec: only async-signal-safe calls.
[[noreturn]] void exec_child(const std::vector<char*>& argv, const std::vector<char*>& envp,
                             const ChildSetup& c) {
  ::setpgid(0, 0);
  if (c.out_fd >= 0) ::dup2(c.out_fd, STDOUT_FILENO);
  if (c.errout_fd >= 0) ::dup2(c.errout_fd, STDERR_FILENO);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != c.parent) ::_exit(127);  // the agent died before prctl took effect
  close_fds_except(*c.keep, c.fallback_max);
  if (c.keep_fd >= 3) ::fcntl(c.keep_fd, F_SETFD, 0);
  if (c.control_fd >= 3) ::fcntl(c.control_fd, F_SETFD, 0);
  if (!c.cpu_mask->empty() &&
      ::syscall(SYS_sched_setaffinity, 0, c.cpu_mask->size() * sizeof(unsigned long),
                c.cpu_mask->data()) != 0) {
    int e = -errno;  // negative: the binding failed, not exec
    (void)!::write(c.err_fd, &e, sizeof(e));
    ::_exit(127);
  }
  if (!c.mem_mask->empty()) {  // maxnode counts one past the mask's bits (libnuma's convention)
    ::syscall(SYS_set_mempolicy, MPOL_PREFERRED, c.mem_mask->data(),
              c.mem_mask->size() * 8 * sizeof(unsigned long) + 1);
  }
  if (c.nofile_soft >= 0) {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0) {
      rl.rlim_cur = static_cast<rlim_t>(c.nofile_soft);
      ::setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ::sigaction(SIGPIPE, &dfl, nullptr);  // the agent ignores these; exec would keep that
  ::sigaction(SIGXFSZ, &dfl, nullptr);
  ::execvpe(argv[0], argv.data(), envp.data());
  int e = errno;
  (void)!::write(c.err_fd, &e, sizeof(e));
  ::_exit(127);
}

}  // namespace

std::vector<int> list_open_fds() {
  std::vector<int> out;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return out;
  const int own = ::dirfd(d);
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = std::atoi(e->d_name);
    if (fd != own) out.push_back(fd);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string WorkerExit::describe() const {
  if (signal == 0) return std::to_string(exit_code);
  const std::string s = "Signal " + std::to_string(signal) + " (SIG" + signal_name(signal) + ")";
  return oom.named() ? s + ", " + oom.headline() : s;
}

std::string WorkerExit::in_words() const {
  return signal != 0 ? describe() : "exit code " + std::to_string(exit_code);
}

WorkerGroup::~WorkerGroup() {
  if (running() > 0) stop(std::chrono::milliseconds(0), SIGKILL);
  for (auto& w : workers_) {
    if (w.pidfd >= 0) ::close(w.pidfd);
  }
}

WorkerGroup::WorkerGroup(Options options) : options_(std::move(options)) {
  auto& keep = options_.inherited_fds;
  keep.erase(std::remove_if(keep.begin(), keep.end(), [](int fd) { return fd < 3; }), keep.end());
  std::sort(keep.begin(), keep.end());
}

void WorkerGroup::start(const std::vector<WorkerSpec>& specs) {
  for (const auto& spec : specs) spawn(spec);
}

void WorkerGroup::spawn(const WorkerSpec& spec) {
  try {
    workers_.push_back(launch(workers_.size(), spec));
  } catch (...) {
    stop(std::chrono::milliseconds(0), SIGKILL);  // the others too: the round cannot start
    throw;
  }
}

void WorkerGroup::respawn(int local_rank, const WorkerSpec& spec) {
  Worker& old = workers_.at(static_cast<std::size_t>(local_rank));
  if (!old.done) throw std::logic_error("respawn: local rank still runs");
  Worker fresh = launch(static_cast<std::size_t>(local_rank), spec);
  if (old.pidfd >= 0) ::close(old.pidfd);
  old = std::move(fresh);
}

WorkerGroup::Worker WorkerGroup::launch(std::size_t rank, const WorkerSpec& spec) {
  if (spec.argv.empty()) throw ConfigError("worker " + std::to_string(rank) + ": empty command");
  // Everything exec needs is built before fork.
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> argv, envp;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) throw IoError("pipe2: " + std::string(std::strerror(errno)));
  std::vector<int> keep = options_.inherited_fds;
  keep.insert(std::upper_bound(keep.begin(), keep.end(), pipefd[1]), pipefd[1]);
  for (int fd : {spec.keep_fd, spec.control_fd}) {
    if (fd >= 3 && !std::binary_search(keep.begin(), keep.end(), fd)) {
      keep.insert(std::upper_bound(keep.begin(), keep.end(), fd), fd);
    }
  }
  rlimit nofile{};
  ::getrlimit(RLIMIT_NOFILE, &nofile);
  const int fallback_max = static_cast<int>(
      std::min<rlim_t>(nofile.rlim_cur == RLIM_INFINITY ? 65536 : nofile.rlim_cur, 1 << 20));
  const std::vector<unsigned long> cpu_mask = kernel_mask(spec.cpus);
  const std::vector<unsigned long> mem_mask =
      kernel_mask(spec.mem_node >= 0 ? std::vector<int>{spec.mem_node} : std::vector<int>{});
  const ChildSetup setup{::getpid(), pipefd[1],    spec.stdout_fd,       spec.stderr_fd,
                         &keep,      fallback_max, options_.nofile_soft, &cpu_mask,
                         &mem_mask,  spec.keep_fd, spec.control_fd};
  OomWatch oom = watch_oom(::getpid());  // the worker starts in the agent's cgroup
  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    throw IoError("fork failed: " + std::string(std::strerror(e)));
  }
  if (pid == 0) exec_child(argv, envp, setup);
  ::close(pipefd[1]);
  ::setpgid(pid, pid);  // also from the parent, so the group exists before any killpg
  int exec_errno = 0;
  ssize_t n = ::read(pipefd[0], &exec_errno, sizeof(exec_errno));  // EOF once exec succeeds
  ::close(pipefd[0]);
  Worker w{static_cast<int>(rank), pid, pidfd_open(pid), false, std::move(oom)};
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    ::kill(pid, SIGKILL);  // the child failed before exec: nothing of ours runs in it
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (w.pidfd >= 0) ::close(w.pidfd);
    if (exec_errno < 0) {
      throw ConfigError("--numa-binding: cannot bind local rank " + std::to_string(rank) +
                        " to CPUs " + cpu_list_text(spec.cpus) + ": " + std::strerror(-exec_errno));
    }
    throw ConfigError("cannot execute '" + spec.argv[0] + "' for local rank " +
                      std::to_string(rank) + ": " + std::strerror(exec_errno));
  }
  return w;
}

WorkerExit WorkerGroup::reap(Worker& w) {
  int status = 0;
  pid_t r;
  do {
    r = ::waitpid(w.pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  w.done = true;
  WorkerExit e;
  e.local_rank = w.local_rank;
  e.pid = w.pid;
  e.when = std::chrono::system_clock::now();
  if (r == w.pid && WIFSIGNALED(status)) e.signal = WTERMSIG(status);
  if (e.signal != 0 && !w.sigkilled) e.oom = check_oom(w.oom, e.signal);
  if (r == w.pid && WIFEXITED(status)) e.exit_code = WEXITSTATUS(status);
  return e;
}

std::optional<WorkerExit> WorkerGroup::wait_any(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Worker*> who;
    for (auto& w : workers_) {
      if (w.done) continue;
      fds.push_back({w.pidfd, POLLIN, 0});
      who.push_back(&w);
    }
    if (fds.empty()) return std::nullopt;
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    int r =
        ::poll(fds.data(), fds.size(), static_cast<int>(std::max<std::int64_t>(0, left.count())));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return std::nullopt;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0) return reap(*who[i]);
    }
  }
}

void WorkerGroup::signal_all(int sig) {
  for (auto& w : workers_) {
    if (w.done) continue;
    w.sigkilled = w.sigkilled || sig == SIGKILL;
    ::killpg(w.pid, sig);
  }
}

std::vector<WorkerExit> WorkerGroup::stop(std::chrono::milliseconds grace, int sig) {
  std::vector<WorkerExit> exits;
  std::vector<pid_t> groups;  // only groups whose leader this call reaps: ids still ours
  for (const auto& w : workers_) {
    if (!w.done) groups.push_back(w.pid);
  }
  signal_all(sig);
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (running() > 0) {
    auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (auto e = wait_any(left)) exits.push_back(*e);
  }
  if (running() > 0) {
    signal_all(SIGKILL);
    for (auto& w : workers_) {
      if (!w.done) exits.push_back(reap(w));
    }
  }
  // A group may hold grandchildren after its leader is gone: clear them out too.
  for (pid_t g : groups) ::killpg(g, SIGKILL);
  return exits;
}

std::vector<int> WorkerGroup::live_pidfds() const {
  std::vector<int> out;
  for (const auto& w : workers_) {
    if (!w.done) out.push_back(w.pidfd);
  }
  return out;
}

WorkerExit WorkerGroup::reap_pidfd(int pidfd) {
  for (auto& w : workers_) {
    if (w.pidfd == pidfd && !w.done) return reap(w);
  }
  throw std::logic_error("reap_pidfd: no running worker has pidfd " + std::to_string(pidfd));
}

std::size_t WorkerGroup::running() const {
  std::size_t n = 0;
  for (const auto& w : workers_) n += w.done ? 0 : 1;
  return n;
}

std::vector<pid_t> WorkerGroup::pids() const {
  std::vector<pid_t> out;
  for (const auto& w : workers_) out.push_back(w.pid);
  return out;
}

}  // namespace ddp::launch
