// Worker argv and environment exactly as torchrun 2.x builds them (LocalElasticAgent.
// _start_workers and run.py's command assembly); see worker_env.hpp.
#include "ddp/launch/worker_env.hpp"

#include "ddp/launch/macros.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <system_error>

namespace ddp::launch {
namespace {

// torchrun's macro: "${local_rank}" and "$local_rank" in an argument become the worker's local
// rank, with string.Template's rules, except that "$$" stays as written (a shell's PID).
std::string substitute_local_rank(const std::string& arg, int local_rank) {
  if (arg.find('$') == std::string::npos) return arg;
  return safe_substitute(arg, {{"local_rank", std::to_string(local_rank)}}, /*escape=*/false);
}

}  // namespace

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

std::vector<std::string> worker_argv(const LaunchConfig& config, int local_rank,
                                     const EnvMap& agent_env) {
  std::vector<std::string> argv;
  if (!config.no_python || config.run_path) {
    auto py = agent_env.find("PYTHON_EXEC");  // declared in proto/src/knobs.cpp
    argv.push_back(py != agent_env.end() && !py->second.empty() ? py->second : "python3");
    argv.push_back("-u");
    if (config.module) argv.push_back("-m");
  }
  argv.push_back(substitute_local_rank(config.entrypoint, local_rank));
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
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(config.max_restarts));
  set("TORCHELASTIC_RUN_ID", g.run_id);
  set("TORCHELASTIC_USE_AGENT_STORE", "True");
  set("TORCHELASTIC_SIGNALS_TO_HANDLE", config.signals_to_handle_text);
  set("TORCHELASTIC_ERROR_FILE",
      g.attempt_dir.empty() ? std::string()
                            : g.attempt_dir + "/" + std::to_string(local_rank) + "/error.json");
  keep_or("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (g.local_world_size > 1) keep_or("OMP_NUM_THREADS", "1");
  return env;
}

}  // namespace ddp::launch
