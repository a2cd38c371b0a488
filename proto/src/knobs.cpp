// The knob registry (knobs.hpp): one row per environment variable read by a ddprun binary.
// docs/env_vars.md lists the same names (tests/unit/proto/knobs_test.cpp checks both ways).
#include "ddp/proto/knobs.hpp"

#include <cstdlib>
#include <stdexcept>

#include "ddp/proto/error.hpp"
#include "ddp/proto/number.hpp"

namespace ddp::knobs {

namespace {
constexpr Knob kKnobs[] = {
    {"DDP_LOG_LEVEL", Kind::text, "info", "every binary",
     "trace, debug, info, warn, error or off, for all subsystem loggers"},
    {"PET_*", Kind::text, "", "ddprun", "a default for any torchrun flag; the command line wins"},
    {"PYTHON_EXEC", Kind::text, "python3", "ddprun", "the interpreter for Python entrypoints"},
    {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT", Kind::seconds, "30", "ddprun",
     "seconds between SIGTERM and SIGKILL when stopping workers"},
    {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", Kind::text, "[${role_name}${local_rank}]:", "ddprun",
     "console prefix of worker lines"},
    {"TORCHELASTIC_ERROR_FILE", Kind::text, "", "ddprun",
     "where a failed ddprun writes its root cause (set by a scheduler or parent launcher)"},
    {"TORCHELASTIC_ENABLE_FILE_TIMER", Kind::text, "", "ddprun",
     "1: serve torch's elastic file timer (FileTimerClient) on a FIFO"},
    {"TORCHELASTIC_TIMER_FILE", Kind::text, "", "ddprun",
     "the file timer's FIFO path (default: a fresh $TMPDIR/watchdog_timer_<uuid4>)"},
    {"OMP_NUM_THREADS", Kind::text, "", "ddprun", "set to 1 for workers when unset and nproc > 1"},
    {"DDP_SHM_ALLREDUCE", Kind::flag01, "1", "ddp-train, ddp_allreduce_bench",
     "0: ranks on one host all-reduce through Gloo instead of shared memory"},
    {"DDP_TRAIN_FAULT", Kind::text, "", "ddp-train",
     "tests only: RANK:STEP[:kill|:hang|:slow=F] (SIGKILL, block before the all-reduce, or F "
     "times slower) at that step"},
    {"GLOO_SOCKET_IFNAME", Kind::text, "", "ddp-train", "the interface Gloo binds"},
    {"OPENBLAS_CORETYPE", Kind::text, "", "ddp-train",
     "OpenBLAS's kernels; unset and OpenBLAS fell back to Prescott on an AVX2/AVX-512 CPU: "
     "ddp-train sets it and re-executes itself"},
    {"CUDA_VISIBLE_DEVICES", Kind::text, "", "ddprun, ddp-train",
     "the GPUs a worker may use; counted by --nproc-per-node=gpu/auto"},
    {"HIP_VISIBLE_DEVICES", Kind::text, "", "ddprun",
     "--virtual-local-rank: when set, each worker's entry of it (torchrun's rule)"},
    {"DDPRUN_NVIDIA_GPUS_DIR", Kind::text, "/proc/driver/nvidia/gpus", "ddprun",
     "where the machine's NVIDIA GPUs are listed (one folder per PCI bus id)"},
    {"DDPRUN_NVML_LIBRARY", Kind::text, "libnvidia-ml.so.1", "ddprun",
     "the live status: the NVML library loaded with dlopen for GPU use and memory"},
    {"DDPRUN_CUBLAS_LIBRARY", Kind::text, "", "ddp-train",
     "CUDA builds: the cuBLAS file to load (alone) instead of searching for libcublas.so.13"},
    {"DDPRUN_NCCL_LIBRARY", Kind::text, "", "ddp-train",
     "CUDA builds: the NCCL file to load (alone) instead of searching for libnccl.so.2"},
    {"LD_LIBRARY_PATH", Kind::text, "", "ddp-train",
     "CUDA builds: folders searched first for cuBLAS and NCCL (as the dynamic loader does)"},
    {"VIRTUAL_ENV CONDA_PREFIX PYTHONPATH", Kind::text, "", "ddp-train",
     "CUDA builds: Python environments whose nvidia-* pip packages may hold cuBLAS and NCCL"},
    {"DDPRUN_HWLOC_XML", Kind::text, "", "ddprun",
     "--numa-binding: an hwloc XML topology to bind by instead of this machine's"},
    {"SLURM_*", Kind::text, "", "ddprun", "Slurm's job and step environment (docs/slurm.md)"},
    {"SLURMD_NODENAME", Kind::text, "", "ddprun", "this node's name in the step's node list"},
    {"SLURM_CONF", Kind::text, "/etc/slurm/slurm.conf", "ddprun",
     "where KillWait is read from under Slurm"},
    {"TMPDIR", Kind::text, "/tmp", "ddprun",
     "where the temporary torchelastic_* log dir and the file timer's FIFO go"},
    {"PATH", Kind::text, "", "ddprun", "where a bare program name is found, as exec finds it"},
    // torchrun's worker contract, read by ddp-train (and any worker); ddprun sets them.
    {"RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE ROLE_NAME ROLE_RANK "
     "ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT",
     Kind::text, "", "ddp-train", "the worker contract (docs/launcher.md, \"Workers\")"},
    {"TORCHELASTIC_*", Kind::text, "", "ddp-train",
     "the worker contract: RESTART_COUNT, MAX_RESTARTS, RUN_ID, ERROR_FILE, USE_AGENT_STORE"},
    {"DDPRUN_STORE_SECRET", Kind::text, "", "ddprund, ddprun, ddpstore, ddp-train",
     "the job's store secret (16 to 4096 bytes): clients authenticate with it, stores demand it "
     "(docs/security.md)"},
    {"DDPRUN_STORE_SECRET_FILE", Kind::text, "", "ddprund, ddprun, ddpstore, ddp-train",
     "a file holding the store secret, owned by the user and mode 600 (or stricter)"},
    {"DDPRUN_STORE_TLS_CERT DDPRUN_STORE_TLS_KEY DDPRUN_STORE_TLS_CA", Kind::text, "",
     "ddprund, ddprun, ddpstore, ddp-train",
     "mutual TLS on the store's connections: this node's certificate, its key, the job's CA "
     "(all three or none)"},
    {"DDPRUN_STORE_TLS_ONLY", Kind::flag01, "0", "ddprund, ddprun",
     "1: a TLS store refuses plain connections except over loopback"},
    {"DDPRUN_HEAL", Kind::integer, "0", "ddp-train",
     "set by ddprun for a worker that replaces one that died (in-place recovery): the heal's "
     "ordinal"},
    {"DDPRUN_PROGRESS_FD", Kind::integer, "", "ddp-train",
     "set by ddprun: the fd on which a worker writes one progress line per step"},
    {"DDPRUN_CONTROL_FD", Kind::integer, "", "ddp-train",
     "set by ddprun: the fd on which the agent tells a worker that its group changes (the "
     "regroup and peer_lost lines)"},
    {"ETCDCTL_CACERT ETCDCTL_CERT ETCDCTL_KEY", Kind::text, "", "ddprun",
     "etcd over TLS: the CA bundle, the client certificate and its key, as etcdctl reads them "
     "(--rdzv-conf cacert, cert, key win)"},
    {"DDPRUN_JOIN_ROUND", Kind::integer, "", "ddp-train",
     "set by ddprun for a worker that joins a running elastic job: the round of the group it "
     "joins; it takes its state from the running ranks"},
};

bool matches(const Knob& k, std::string_view name) {
  if (k.name.find(' ') != std::string_view::npos) {  // a set of names, one declaration
    std::string_view rest = k.name;
    while (!rest.empty()) {
      auto sp = rest.find(' ');
      if (rest.substr(0, sp) == name) return true;
      rest = sp == std::string_view::npos ? std::string_view() : rest.substr(sp + 1);
    }
    return false;
  }
  if (!k.name.empty() && k.name.back() == '*') {
    return name.substr(0, k.name.size() - 1) == k.name.substr(0, k.name.size() - 1);
  }
  return k.name == name;
}
}  // namespace

std::span<const Knob> all() { return kKnobs; }

const Knob& declared(std::string_view name) {
  const Knob* family = nullptr;
  for (const auto& k : kKnobs) {
    if (k.name == name) return k;
    if (matches(k, name) && (!family || k.name.back() != '*')) family = &k;
  }
  if (family) return *family;
  throw std::logic_error("environment variable " + std::string(name) +
                         " is read but not declared in proto/src/knobs.cpp");
}

std::optional<std::string> text(std::string_view name, const Env* env) {
  (void)declared(name);
  const std::string key(name);
  if (env) {
    auto it = env->find(key);
    if (it == env->end()) return std::nullopt;
    return it->second;
  }
  const char* v = std::getenv(key.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

std::int64_t integer(std::string_view name, std::int64_t min, std::int64_t max, const Env* env) {
  auto v = text(name, env);
  const std::string t = v ? *v : std::string(declared(name).fallback);
  return parse_int(t, name, min, max);
}

double seconds(std::string_view name, const Env* env) {
  auto v = text(name, env);
  const std::string t = v ? *v : std::string(declared(name).fallback);
  return static_cast<double>(parse_seconds(t, name).count()) / 1000;
}

bool flag01(std::string_view name, const Env* env) {
  auto v = text(name, env);
  const std::string t = v ? *v : std::string(declared(name).fallback);
  if (t != "0" && t != "1") {
    throw ConfigError(std::string(name) + "='" + t + "' must be 0 or 1");
  }
  return t == "1";
}

}  // namespace ddp::knobs
