// ddprun: the torchrun-compatible launcher. Parses torchrun's command line (and PET_*), then
// runs the node's agent; the exit code carries the first failure's code or 128 + signal.
// `ddprun status ...` is the status command (status_cli.hpp), not a launch.
// Before anything else it records the fds it inherited (the workers get those, no others),
// becomes the subreaper of its subtree and forks the orphan watcher (descendants.hpp).
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string_view>

#include "ddp/launch/agent.hpp"
#include "ddp/launch/agent_etcd.hpp"
#include "ddp/launch/agent_error_file.hpp"
#include "ddp/launch/descendants.hpp"
#include "ddp/launch/round_workers.hpp"
#include "ddp/launch/status_cli.hpp"
#include "ddp/launch/worker_env.hpp"
#include "ddp/launch/worker_group.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/version.hpp"

extern char** environ;

namespace {

// A node with many workers needs an fd or three per worker: the soft limit goes up to the hard
// one for the agent; workers get the original back (WorkerGroup).
long long raise_nofile() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == rl.rlim_max) return -1;
  const auto soft = static_cast<long long>(rl.rlim_cur);
  rl.rlim_cur = rl.rlim_max;
  return ::setrlimit(RLIMIT_NOFILE, &rl) == 0 ? soft : -1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "status") {
    return ddp::launch::run_status_command(
        std::vector<std::string>(argv + 2, argv + argc), [](const ddp::launch::StatusOptions& o) {
          return ddp::launch::open_etcd_view(o.members, o.rdzv_conf);
        });
  }
  ddp::launch::AgentProcess process;
  process.inherited_fds = ddp::launch::list_open_fds();  // before ddprun opens any of its own
  std::erase_if(process.inherited_fds, [](int fd) { return fd < 3; });
  ddp::launch::EnvMap env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  // `ddprun launch ...`: torch.distributed.launch's command line (its flags are torchrun's,
  // plus --use-env; without it each script gets --local-rank=N). `python -m ddprun.launch`
  // from the wheel runs this.
  std::vector<std::string> args(argv, argv + argc);
  const bool legacy_launch = args.size() > 1 && args[1] == "launch";
  if (legacy_launch) args.erase(args.begin() + 1);
  auto parsed = ddp::launch::parse_launch_args(args, env);
  if (!parsed.config) {
    (parsed.exit_code == 0 ? std::cout : std::cerr) << parsed.message << "\n";
    return parsed.exit_code;
  }
  if (!parsed.notice.empty()) std::cerr << parsed.notice << "\n";
  // Still one thread and no socket: the watcher starts with nothing of the agent's.
  ddp::launch::become_subreaper();
  int watcher_pipe = -1;
  process.watcher = ddp::launch::start_watcher(&watcher_pipe, argc, argv);
  process.nofile_soft = raise_nofile();
  // Unlike torchrun, a compiled program (ELF) needs no --no-python: python could not run it.
  auto& config = *parsed.config;
  if (legacy_launch && !config.use_env) {
    if (config.no_python) {  // torch.distributed.launch's own rule and words
      std::cerr << "ddprun launch: When using the '--no-python' flag, you must also set the "
                   "'--use-env' flag.\n";
      return 2;
    }
    config.local_rank_arg = true;
    std::cerr << "ddprun launch: torch.distributed.launch's mode: each script gets "
                 "--local-rank=N (with --use-env, LOCAL_RANK alone, as under ddprun)\n";
  }
  // A bare name that is no file here but a program on PATH (`ddprun ddp-train ...`) is found
  // as exec finds it.
  if (!config.no_python && !config.module && !config.run_path) {
    std::string program = config.entrypoint;
    std::error_code ec;
    if (!std::filesystem::exists(program, ec)) {
      auto path = env.find("PATH");
      program = ddp::launch::find_on_path(program, path == env.end() ? "" : path->second);
    }
    if (!program.empty() && ddp::launch::is_native_executable(program)) config.no_python = true;
  }
  if (!config.no_python || config.run_path) {  // said once: a wrong python fails every rank
    std::error_code ec;
    const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path().string();
    const auto py =
        ddp::launch::choose_python(env, exe, std::string_view(ddp::build_kind()) == "wheel");
    config.python = py.path;
    std::cerr << "ddprun: Python workers run " << py.path << " (" << py.why << ")\n";
  }
  int rc = 1;
  std::string error;  // for $TORCHELASTIC_ERROR_FILE
  try {
    rc = ddp::launch::run_agent(config, env, process);
  } catch (const ddp::Error& e) {  // the kind decides the exit code: 2 usage/config, else 1
    error = std::string("ddprun: ") + e.what();
    std::cerr << error << "\n";
    rc = ddp::exit_code(e.code());
  } catch (const std::exception& e) {
    error = std::string("ddprun: ") + e.what();
    std::cerr << error << "\n";
    rc = 1;
  }
  // The root cause, where a scheduler or a parent launcher asked for it (env: ddprun's own).
  ddp::launch::write_agent_error_file(env, rc, error);
  // Whatever a worker left behind goes with the agent (the workers are gone by now).
  ddp::launch::clear_leftovers(process.watcher);
  ddp::launch::stop_watcher(process.watcher, watcher_pipe);
  return rc;
}
