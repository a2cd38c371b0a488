// LaunchConfig: everything ddprun is told by its command line and PET_* environment, parsed
// and validated with torchrun 2.x's flags, spellings and defaults (torch-compat.md §1).
// parse_launch_args() has no side effects, so every flag is unit-tested.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ddp/rdzv/access.hpp"
#include "ddp/rdzv/endpoint.hpp"

namespace ddp::launch {

// torchrun's Std: which of a worker's streams go to files (redirect) or files + console (tee).
enum class Std : std::uint8_t { none = 0, out = 1, err = 2, all = 3 };

// "0".."3" for every local rank, or "0:1,1:2" per local rank.
struct StdSpec {
  std::optional<Std> all_ranks;
  std::map<int, Std> per_rank;
  Std for_rank(int local_rank) const;
};

using rdzv::Endpoint;

struct LaunchConfig {
  int min_nodes = 1;
  int max_nodes = 1;
  std::string nproc_per_node = "1";  // an integer, or cpu | gpu | auto (resolved at launch)
  // --max-nproc-per-node: raises the bound on workers per node (limits.hpp); unset: default.
  std::optional<int> max_nproc_per_node;
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;  // as given; see endpoint()
  std::string rdzv_id = "none";
  std::map<std::string, std::string> rdzv_conf;
  bool standalone = false;
  // A private c10d store on a free local port for a one-node job: --standalone, or torch 2.15's
  // default for static with no endpoint and no --master-port on one node (cli.cpp).
  bool private_store = false;
  int max_restarts = 0;
  double monitor_interval_s = 0.1;
  std::string start_method = "spawn";
  std::string role = "default";
  bool module = false;
  bool no_python = false;
  bool run_path = false;
  std::string log_dir;
  StdSpec redirects;
  StdSpec tee;
  std::vector<int> local_ranks_filter;  // empty: every rank's console output
  // Console prefix of worker lines: --log-line-prefix-template, else torchrun's
  // TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, else "[${role_name}${local_rank}]:". "" = raw.
  std::optional<std::string> log_line_prefix_template;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  std::uint16_t master_port = 29500;
  std::string local_addr;
  // The interpreter of Python workers when PYTHON_EXEC is unset: "" is python3 from PATH; a
  // ddprun installed from a wheel sets its own environment's (choose_python, worker_env.hpp).
  std::string python;
  // `ddprun launch` (torch.distributed.launch's stand-in) without --use-env: each worker gets
  // --local-rank=N between the script and its arguments, as torch's launch module gives it.
  bool use_env = false;
  bool local_rank_arg = false;
  std::vector<int> signals_to_handle;  // signal numbers
  // The flag's text as given: exported as TORCHELASTIC_SIGNALS_TO_HANDLE, as torchrun does.
  std::string signals_to_handle_text = "SIGTERM,SIGINT,SIGHUP,SIGQUIT";
  // --shutdown-timeout: seconds from the stop signal to SIGKILL; unset: the environment's
  // TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30 (torchrun's order).
  std::optional<int> shutdown_timeout_s;
  // --numa-binding: "" (off), node, socket, exclusive or core-complex (numa_binding.hpp).
  std::string numa_binding;
  // --virtual-local-rank: every worker sees LOCAL_RANK=0 and only its own GPU.
  bool virtual_local_rank = false;
  // --duplicate-stdout/stderr-filters: lines containing any of these also go to
  // filtered_stdout.log / filtered_stderr.log of the attempt's log folder. Empty: off.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  // ddprun's own --per-worker-slurm-env: SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NTASKS
  // ... rewritten for each worker from its ranks (slurm_worker_env.hpp). Off, as in torchrun.
  bool per_worker_slurm_env = false;
  bool master_port_given = false;
  // ddprun's own hang and straggler detection (hang_policy.hpp): seconds without progress
  // before the stacks are taken (0: off), what to do then, and the straggler factor (0: off).
  double hang_timeout_s = 600;
  std::string on_hang = "report";  // report | dump | restart | stop
  double straggler_factor = 3.0;   // --master-port (or PET_MASTER_PORT) was given
  // ddprun's own live status (docs/status.md): publishing interval (0: off), the agent's HTTP
  // views (-1: off; 0: a free port), their address ("": where the store binds), the trace
  // file ("": none) and the terminal progress line (auto | tty | lines | off).
  double status_interval_s = 1;
  // How long the agent rides out an unreachable rendezvous store before it stops the job
  // (docs/rendezvous.md, "When the store goes away"); 0: at once, as before.
  double store_outage_grace_s = 300;
  int http_port = -1;
  std::string http_host;
  std::string trace_path;
  // --gpu-job-mapping-dir: DCGM exporter's job mapping folder ("": none; gpu_job_mapping.hpp).
  std::string gpu_job_mapping_dir;
  std::string progress = "auto";
  // --store-allow: networks admitted to the agent's stores without authenticating
  // (docs/security.md), besides loopback and the round's nodes.
  std::vector<rdzv::Cidr> store_allow;
  std::string http_token_file;              // --http-token-file ("": the job's secret, if any)
  std::string http_tls_cert, http_tls_key;  // --http-tls-cert/-key: HTTPS views
  // --store-allow-uids: besides this user and root, who may use them over loopback (nullopt:
  // any local user).
  std::optional<std::vector<std::uint32_t>> store_allow_uids = std::vector<std::uint32_t>{};
  std::string entrypoint;
  std::vector<std::string> args;

  // The rendezvous endpoint, parsed once by parse_launch_args with torchrun's defaults filled
  // in: port 29400 for c10d; for static with no endpoint, --master-addr:--master-port.
  // etcd-v3: every etcd member of --rdzv-endpoint (HOST[:PORT],..., port 2379), rdzv the first.
  Endpoint rdzv;
  std::vector<Endpoint> etcd_members;
  const Endpoint& endpoint() const { return rdzv; }
  bool etcd() const { return rdzv_backend == "etcd-v3"; }
};

// The outcome of parsing: a config, or a message for the user and the exit code to use
// (0 after --help, 2 for bad input).
struct ParseResult {
  std::optional<LaunchConfig> config;
  std::string message;
  int exit_code = 0;
  std::string notice;  // with a config: what was taken from the environment (Slurm), for stderr
};

// argv as main() gets it; env as NAME -> value (PET_* supply defaults, the command line wins).
ParseResult parse_launch_args(const std::vector<std::string>& argv,
                              const std::map<std::string, std::string>& env);

// The rendezvous endpoint of a config whose flags are validated (the one parse, above):
// --rdzv-endpoint, or --master-addr:--master-port for static. Throws ddp::ConfigError.
Endpoint resolve_endpoint(const LaunchConfig& c);

using rdzv::parse_endpoint;

}  // namespace ddp::launch
