// Worker argv and environment exactly as torchrun 2.x builds them (LocalElasticAgent.
// _start_workers and run.py's command assembly); see worker_env.hpp.
#include "ddp/launch/worker_env.hpp"

#include "ddp/launch/macros.hpp"
#include "ddp/launch/run_path.hpp"
#include "ddp/launch/slurm_worker_env.hpp"
#include "ddp/proto/error.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string_view>
#include <system_error>

namespace ddp::launch {
namespace {

// torchrun's macro: "${local_rank}" and "$local_rank" in an argument become the worker's local
// rank, with string.Template's rules, except that "$$" stays as written (a shell's PID).
std::string substitute_local_rank(const std::string& arg, int local_rank) {
  if (arg.find('$') == std::string::npos) return arg;
  return safe_substitute(arg, {{"local_rank", std::to_string(local_rank)}}, /*escape=*/false);
}

// --virtual-local-rank (torchrun's _set_local_rank_env): this worker's entry of the parent's
// HIP_VISIBLE_DEVICES (when set and not empty: it wins on ROCm) or CUDA_VISIBLE_DEVICES, spaces
// stripped; str(local_rank) when neither is set. ConfigError when the list is too short.
struct VirtualDevice {
  std::string device;
  bool hip = false;  // HIP_VISIBLE_DEVICES is written too
};

VirtualDevice virtual_device(const EnvMap& agent_env, int local_rank) {
  VirtualDevice v;
  const char* name = "CUDA_VISIBLE_DEVICES";
  const std::string* list = nullptr;
  if (auto hip = agent_env.find("HIP_VISIBLE_DEVICES");
      hip != agent_env.end() && !hip->second.empty()) {
    name = "HIP_VISIBLE_DEVICES";
    list = &hip->second;
    v.hip = true;
  } else if (auto cuda = agent_env.find("CUDA_VISIBLE_DEVICES"); cuda != agent_env.end()) {
    list = &cuda->second;
  }
  if (list == nullptr) {
    v.device = std::to_string(local_rank);
    return v;
  }
  std::vector<std::string> entries;
  for (std::size_t start = 0;;) {
    const auto comma = list->find(',', start);
    entries.push_back(list->substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (static_cast<std::size_t>(local_rank) >= entries.size()) {
    throw ConfigError("--virtual-local-rank: local rank " + std::to_string(local_rank) +
                      " has no GPU in " + name + "=" + *list + " (" +
                      std::to_string(entries.size()) +
                      (entries.size() == 1 ? " entry" : " entries") +
                      "); give at most one worker per entry (--nproc-per-node)");
  }
  constexpr std::string_view kSpace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";  // Python's strip()
  const std::string& e = entries[static_cast<std::size_t>(local_rank)];
  const auto b = e.find_first_not_of(kSpace);
  v.device = b == std::string::npos ? "" : e.substr(b, e.find_last_not_of(kSpace) - b + 1);
  return v;
}

}  // namespace

std::string check_worker_env_options(const LaunchConfig& config, int nproc,
                                     const EnvMap& agent_env) {
  if (config.virtual_local_rank && nproc > 0) (void)virtual_device(agent_env, nproc - 1);
  if (config.per_worker_slurm_env && !under_slurm(agent_env)) {
    return "--per-worker-slurm-env: not inside a Slurm job (SLURM_JOB_ID is unset), so the "
           "workers get no SLURM_* variables from ddprun";
  }
  return "";
}

bool is_native_executable(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, sizeof magic) && magic[0] == 0x7f && magic[1] == 'E' && magic[2] == 'L' &&
         magic[3] == 'F';
}

std::string find_on_path(const std::string& name, const std::string& path_var) {
  if (name.empty() || name.find('/') != std::string::npos) return "";
  // exec's search path when PATH is unset or empty.
  const std::string dirs = path_var.empty() ? std::string("/bin:/usr/bin") : path_var;
  std::size_t start = 0;
  while (start <= dirs.size()) {
    auto end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate)) {
      return candidate;
    }
    start = end + 1;
  }
  return "";
}

PythonChoice choose_python(const EnvMap& agent_env, const std::string& exe_dir, bool from_wheel) {
  auto py = agent_env.find("PYTHON_EXEC");
  if (py != agent_env.end() && !py->second.empty()) return {py->second, "PYTHON_EXEC"};
  if (from_wheel && !exe_dir.empty()) {
    // The scripts folder itself (<prefix>/bin), or, where auditwheel moved the programs into
    // <prefix>/lib/pythonX.Y/site-packages/ddprun.scripts, that prefix's bin.
    std::vector<std::string> bins{exe_dir};
    const std::filesystem::path dir(exe_dir);
    if (dir.filename() == "ddprun.scripts" && dir.parent_path().filename() == "site-packages") {
      bins.push_back(exe_dir + "/../../../../bin");
    }
    for (const std::string& bin : bins) {
      for (const char* name : {"python3", "python"}) {
        const std::string candidate = bin + "/" + name;
        if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate)) {
          // The folder made plain; the venv's python3 itself stays a link to the base
          // interpreter (resolving it would leave the venv).
          std::error_code ec;
          const auto folder = std::filesystem::weakly_canonical(bin, ec);
          return {ec ? candidate : (folder / name).string(),
                  "the environment ddprun is installed in"};
        }
      }
    }
  }
  return {"python3", "python3 from PATH"};
}

std::vector<std::string> worker_argv(const LaunchConfig& config, int local_rank,
                                     const EnvMap& agent_env) {
  std::vector<std::string> argv;
  if (!config.no_python || config.run_path) {
    auto py = agent_env.find("PYTHON_EXEC");  // declared in proto/src/knobs.cpp
    argv.push_back(py != agent_env.end() && !py->second.empty() ? py->second
                   : !config.python.empty()                     ? config.python
                                                                : "python3");
    argv.push_back("-u");
    if (config.run_path) {  // torch's run_script_path under record() (run_path.hpp)
      argv.push_back("-c");
      argv.push_back(run_path_bootstrap());
    } else if (config.module) {
      argv.push_back("-m");
    }
  }
  argv.push_back(substitute_local_rank(config.entrypoint, local_rank));
  if (config.local_rank_arg) argv.push_back("--local-rank=" + std::to_string(local_rank));
  for (const auto& a : config.args) argv.push_back(substitute_local_rank(a, local_rank));
  return argv;
}

EnvMap worker_env(const LaunchConfig& config, const GroupInfo& g, int local_rank,
                  const EnvMap& agent_env) {
  EnvMap env = agent_env;
  auto set = [&](const char* name, const std::string& value) { env[name] = value; };
  auto keep_or = [&](const char* name, const std::string& value) { env.emplace(name, value); };
  set("LOCAL_RANK", std::to_string(local_rank));
  set("RANK", std::to_string(g.base_global_rank + local_rank));
  set("GROUP_RANK", std::to_string(g.group_rank));
  set("ROLE_RANK", std::to_string(g.base_role_rank + local_rank));
  set("ROLE_NAME", config.role);
  set("LOCAL_WORLD_SIZE", std::to_string(g.local_world_size));
  set("WORLD_SIZE", std::to_string(g.world_size));
  set("GROUP_WORLD_SIZE", std::to_string(g.group_world_size));
  set("ROLE_WORLD_SIZE", std::to_string(g.role_world_size));
  set("MASTER_ADDR", g.master_addr);
  set("MASTER_PORT", std::to_string(g.master_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(g.restart_count));
  if (g.join_round >= 0) set("DDPRUN_JOIN_ROUND", std::to_string(g.join_round));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(config.max_restarts));
  set("TORCHELASTIC_RUN_ID", g.run_id);
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  set("TORCHELASTIC_SIGNALS_TO_HANDLE", config.signals_to_handle_text);
  set("TORCHELASTIC_ERROR_FILE",
      g.attempt_dir.empty() ? std::string()
                            : g.attempt_dir + "/" + std::to_string(local_rank) + "/error.json");
  keep_or("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (g.local_world_size > 1) keep_or("OMP_NUM_THREADS", "1");
  if (config.virtual_local_rank) {  // every worker sees its own GPU as device 0
    set("LOCAL_RANK", "0");
    const auto v = virtual_device(agent_env, local_rank);
    set("CUDA_VISIBLE_DEVICES", v.device);
    if (v.hip) set("HIP_VISIBLE_DEVICES", v.device);
  }
  if (config.per_worker_slurm_env && under_slurm(agent_env)) {
    apply_slurm_worker_env(env, SlurmWorkerRanks{g.base_global_rank + local_rank,
                                                 config.virtual_local_rank ? 0 : local_rank,
                                                 g.group_rank, g.world_size, g.local_world_size,
                                                 g.group_world_size, g.base_global_rank});
  }
  return env;
}

}  // namespace ddp::launch
