// Starting one round's workers one by one, and stopping everything below the agent (see
// round_workers.hpp).
#include "ddp/launch/round_workers.hpp"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "ddp/launch/descendants.hpp"
#include "ddp/launch/numa_binding.hpp"
#include "ddp/proto/error.hpp"

namespace ddp::launch {

SpawnResult spawn_workers(const SpawnPlan& plan, OutputPump& pump, WorkerGroup& workers,
                          int sigfd) {
  SpawnResult result;
  const auto& f = plan.config.local_ranks_filter;
  if (!plan.group.attempt_dir.empty()) {  // --duplicate-*-filters, into the attempt's folder
    try {
      pump.duplicate(false, plan.config.duplicate_stdout_filters,
                     plan.group.attempt_dir + "/filtered_stdout.log");
      pump.duplicate(true, plan.config.duplicate_stderr_filters,
                     plan.group.attempt_dir + "/filtered_stderr.log");
    } catch (const IoError& e) {
      result.error = e.what();
      return result;
    }
  }
  const auto numa =
      plan.config.numa_binding.empty()  // once per round, before any fork
          ? std::vector<RankBinding>{}
          : numa_bindings_for_round(plan.config.numa_binding, plan.nproc, plan.agent_env);
  for (int r = 0; r < plan.nproc; ++r) {
    pollfd p{sigfd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1) {
      result.stop_signal = true;
      return result;
    }
    WorkerSpec spec{worker_argv(plan.config, r, plan.agent_env),
                    worker_env(plan.config, plan.group, r, plan.agent_env)};
    if (!numa.empty()) {
      spec.cpus = numa[static_cast<std::size_t>(r)].cpus;
      spec.mem_node = numa[static_cast<std::size_t>(r)].mem_node;
    }
    const bool shown = f.empty() || std::find(f.begin(), f.end(), r) != f.end();
    PrefixVars pv{plan.config.role, r, plan.group.base_global_rank + r, plan.group.group_rank,
                  plan.host};
    try {
      const std::string rank_dir = RunLogDir::make_rank_dir(plan.group.attempt_dir, r);
      pump.attach(spec, r, expand_prefix(plan.prefix_template, pv),
                  plan.config.redirects.for_rank(r), plan.config.tee.for_rank(r), shown, rank_dir);
      if (plan.progress) {
        spec.keep_fd = plan.progress->open_rank(r, std::chrono::steady_clock::now());
        spec.control_fd = plan.progress->control_end(r);
      }
    } catch (const IoError& e) {
      pump.after_start();
      result.error = e.what();
      result.rank = r;
      return result;
    }
    if (plan.progress) {
      spec.env["DDPRUN_PROGRESS_FD"] = std::to_string(spec.keep_fd);
      spec.env["DDPRUN_CONTROL_FD"] = std::to_string(spec.control_fd);
    }
    workers.spawn(spec);
    pump.after_start();  // the worker holds its ends now
    if (plan.progress) plan.progress->after_start();
  }
  return result;
}

std::string respawn_worker(const SpawnPlan& plan, int r, int heal, OutputPump& pump,
                           WorkerGroup& workers) {
  WorkerSpec spec{worker_argv(plan.config, r, plan.agent_env),
                  worker_env(plan.config, plan.group, r, plan.agent_env)};
  spec.env["DDPRUN_HEAL"] = std::to_string(heal);
  if (!plan.config.numa_binding.empty()) {
    const auto numa = numa_bindings_for_round(plan.config.numa_binding, plan.nproc, plan.agent_env);
    spec.cpus = numa[static_cast<std::size_t>(r)].cpus;
    spec.mem_node = numa[static_cast<std::size_t>(r)].mem_node;
  }
  const auto& f = plan.config.local_ranks_filter;
  const bool shown = f.empty() || std::find(f.begin(), f.end(), r) != f.end();
  PrefixVars pv{plan.config.role, r, plan.group.base_global_rank + r, plan.group.group_rank,
                plan.host};
  try {
    std::string rank_dir;
    if (!plan.group.attempt_dir.empty()) {  // the dead worker's files stay where they are
      rank_dir =
          RunLogDir::make_rank_dir(plan.group.attempt_dir, r) + "/heal_" + std::to_string(heal);
      std::filesystem::create_directories(rank_dir);
    }
    pump.attach(spec, r, expand_prefix(plan.prefix_template, pv), plan.config.redirects.for_rank(r),
                plan.config.tee.for_rank(r), shown, rank_dir);
    if (plan.progress) {
      spec.keep_fd = plan.progress->open_rank(r, std::chrono::steady_clock::now());
      spec.control_fd = plan.progress->control_end(r);
      spec.env["DDPRUN_PROGRESS_FD"] = std::to_string(spec.keep_fd);
      spec.env["DDPRUN_CONTROL_FD"] = std::to_string(spec.control_fd);
    }
    workers.respawn(r, spec);
  } catch (const Error& e) {
    pump.after_start();
    return e.what();
  } catch (const std::exception& e) {
    pump.after_start();
    return std::string("cannot make the replacement's folder: ") + e.what();
  }
  pump.after_start();
  if (plan.progress) plan.progress->after_start();
  return "";
}

void stop_round(WorkerGroup& workers, std::chrono::milliseconds grace, int sig, pid_t watcher) {
  signal_descendants(sig, workers.pids(), watcher);
  workers.stop(grace, sig);
  clear_leftovers(watcher);
}

void clear_leftovers(pid_t watcher) {
  kill_tree(::getpid(), {}, watcher);
  reap_orphans({});
}

}  // namespace ddp::launch
