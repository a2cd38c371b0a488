// Reading and checking the worker environment (see env.hpp).
#include "ddp/worker/env.hpp"

#include <charconv>
#include <optional>

#include "ddp/proto/error.hpp"
#include "ddp/proto/number.hpp"

namespace ddp::worker {
namespace {

using Env = std::map<std::string, std::string>;

std::optional<std::string> find(const Env& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

long long parse_int(const std::string& name, const std::string& text, long long lo, long long hi) {
  return ddp::parse_int(text, name, lo, hi);  // the one parser, its one message shape
}

int required_int(const Env& env, const std::string& name, long long lo, long long hi) {
  auto v = find(env, name);
  if (!v) {
    throw ConfigError(name +
                      " is not set (is this process started by ddprun, torchrun or srun with "
                      "the torchrun environment?)");
  }
  return static_cast<int>(parse_int(name, *v, lo, hi));
}

int optional_int(const Env& env, const std::string& name, int fallback, long long lo,
                 long long hi) {
  auto v = find(env, name);
  return v ? static_cast<int>(parse_int(name, *v, lo, hi)) : fallback;
}

void below(const char* a, int av, const char* b, int bv) {
  if (av >= bv) {
    throw ConfigError(std::string(a) + "=" + std::to_string(av) + " is not below " + b + "=" +
                      std::to_string(bv));
  }
}

}  // namespace

std::string WorkerEnv::store_prefix() const {
  return "/worker/attempt_" + std::to_string(restart_count);
}

WorkerEnv read_worker_env(const Env& env) {
  constexpr long long kMax = 1 << 30;
  WorkerEnv w;
  w.world_size = required_int(env, "WORLD_SIZE", 1, kMax);
  w.rank = required_int(env, "RANK", 0, kMax);
  below("RANK", w.rank, "WORLD_SIZE", w.world_size);
  w.local_world_size = optional_int(env, "LOCAL_WORLD_SIZE", w.world_size, 1, kMax);
  w.local_rank = optional_int(env, "LOCAL_RANK", w.rank % w.local_world_size, 0, kMax);
  below("LOCAL_RANK", w.local_rank, "LOCAL_WORLD_SIZE", w.local_world_size);
  if (w.local_world_size > w.world_size) {
    throw ConfigError("LOCAL_WORLD_SIZE=" + std::to_string(w.local_world_size) +
                      " exceeds WORLD_SIZE=" + std::to_string(w.world_size));
  }
  w.group_world_size = optional_int(env, "GROUP_WORLD_SIZE", 1, 1, kMax);
  w.group_rank = optional_int(env, "GROUP_RANK", 0, 0, kMax);
  below("GROUP_RANK", w.group_rank, "GROUP_WORLD_SIZE", w.group_world_size);
  w.role_world_size = optional_int(env, "ROLE_WORLD_SIZE", w.world_size, 1, kMax);
  w.role_rank = optional_int(env, "ROLE_RANK", w.rank, 0, kMax);
  below("ROLE_RANK", w.role_rank, "ROLE_WORLD_SIZE", w.role_world_size);
  if (auto v = find(env, "ROLE_NAME")) w.role_name = *v;

  auto addr = find(env, "MASTER_ADDR");
  if (!addr || addr->empty()) {
    throw ConfigError("MASTER_ADDR is not set: the address of the store (ddprun sets it)");
  }
  w.master_addr = *addr;
  auto port = find(env, "MASTER_PORT");
  if (!port) throw ConfigError("MASTER_PORT is not set: the port of the store (ddprun sets it)");
  try {
    w.master_port = static_cast<std::uint16_t>(parse_int("MASTER_PORT", *port, 1, 65535));
  } catch (const ConfigError&) {
    throw ConfigError("MASTER_PORT='" + *port + "' is not a port (1..65535)");
  }

  w.restart_count = optional_int(env, "TORCHELASTIC_RESTART_COUNT", 0, 0, kMax);
  w.max_restarts = optional_int(env, "TORCHELASTIC_MAX_RESTARTS", 0, 0, kMax);
  if (auto v = find(env, "TORCHELASTIC_RUN_ID")) w.run_id = *v;
  if (auto v = find(env, "TORCHELASTIC_USE_AGENT_STORE")) w.use_agent_store = *v == "True";
  if (auto v = find(env, "TORCHELASTIC_ERROR_FILE")) w.error_file = *v;
  return w;
}

}  // namespace ddp::worker
