// ddprun's flag table and what is made from it: --help, the docs table and shell completion
// scripts (see cli_flags.hpp). Meanings and defaults are torchrun 2.15's unless the help says
// "ddprun's own".
#include "ddp/launch/cli_flags.hpp"

#include <sstream>
#include <vector>

#include "ddp/proto/error.hpp"

namespace ddp::launch {
namespace {

using G = FlagGroup;

constexpr FlagSpec kFlags[] = {
    {"nnodes", "--nnodes", false, true, G::size, "NNODES", "1:1",
     "Number of nodes, or MIN:MAX for an elastic job (c10d)."},
    {"nproc_per_node", "--nproc-per-node,--nproc_per_node", false, true, G::size, "NPROC_PER_NODE",
     "1",
     "Workers per node: an integer, cpu (usable CPUs), gpu (GPUs in CUDA_VISIBLE_DEVICES) or "
     "auto (GPUs, else CPUs)."},
    {"rdzv_backend", "--rdzv-backend,--rdzv_backend", false, true, G::rendezvous, "RDZV_BACKEND",
     "static", "Rendezvous backend: static, c10d or etcd-v3 (etcd and etcd-v2 run as etcd-v3)."},
    {"rdzv_endpoint", "--rdzv-endpoint,--rdzv_endpoint", false, true, G::rendezvous,
     "RDZV_ENDPOINT", "(none)",
     "The rendezvous store as HOST[:PORT] (c10d's port: 29400). Under Slurm: the first host of "
     "the job. etcd-v3: the etcd members, HOST[:PORT],... (port 2379)."},
    {"rdzv_id", "--rdzv-id,--rdzv_id", false, true, G::rendezvous, "RDZV_ID", "none",
     "User-defined id of the job; every node gives the same."},
    {"rdzv_conf", "--rdzv-conf,--rdzv_conf", false, true, G::rendezvous, "RDZV_CONF", "(none)",
     "More rendezvous settings: KEY=VALUE,... (join_timeout, last_call_timeout, read_timeout, "
     "close_timeout, timeout, keep_alive_interval, keep_alive_max_attempt, is_host; etcd-v3: "
     "key_prefix, user, password, password_file)."},
    {"standalone", "--standalone", true, true, G::rendezvous, "", "off",
     "One node on its own: a private c10d store on a free port and a fresh run id; "
     "--rdzv-backend, --rdzv-endpoint and --rdzv-id are ignored."},
    {"max_restarts", "--max-restarts,--max_restarts", false, true, G::user_code, "MAX_RESTARTS",
     "0", "Restarts of the worker group before the job fails."},
    {"monitor_interval", "--monitor-interval,--monitor_interval", false, true, G::user_code,
     "MONITOR_INTERVAL", "0.1",
     "Seconds between checks of the workers (ddprun sees exits at once; kept for torchrun)."},
    {"start_method", "--start-method,--start_method", false, true, G::user_code,
     "{spawn,fork,forkserver}", "spawn",
     "torchrun's multiprocessing start method; accepted, every worker is a fresh process."},
    {"event_log_handler", "--event-log-handler,--event_log_handler", false, true, G::user_code,
     "EVENT_LOG_HANDLER", "null", "torchrun's event logging handler; accepted."},
    {"role", "--role", false, true, G::user_code, "ROLE", "default",
     "User-defined role of the workers (ROLE_NAME)."},
    {"module", "-m,--module", true, true, G::user_code, "", "off",
     "Run the script as a Python module, as 'python -m'."},
    {"no_python", "--no-python,--no_python", true, true, G::user_code, "", "off",
     "Run the script itself, not with python (a compiled program needs no flag)."},
    {"run_path", "--run-path,--run_path", true, true, G::user_code, "", "off",
     "Run the script with runpy.run_path under torchrun's error recording; takes precedence "
     "over --no-python."},
    {"log_dir", "--log-dir,--log_dir", false, true, G::user_code, "LOG_DIR", "(a temporary folder)",
     "Base folder of the log files; each run gets a private <rdzv_id>_<random> folder in it."},
    {"redirects", "-r,--redirects", false, true, G::user_code, "REDIRECTS", "0",
     "Send workers' streams to files: 0 none, 1 out, 2 err, 3 both; or per local rank as "
     "0:1,1:2."},
    {"tee", "-t,--tee", false, true, G::user_code, "TEE", "0",
     "Like --redirects, but the console gets the lines too."},
    {"log_line_prefix_template", "--log-line-prefix-template,--log_line_prefix_template", false,
     true, G::user_code, "LOG_LINE_PREFIX_TEMPLATE", "[${role_name}${local_rank}]:",
     "Prefix of each worker line on the console; macros ${role_name}, ${local_rank}, ${rank}, "
     "${hostname}. Else TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE."},
    {"local_ranks_filter", "--local-ranks-filter,--local_ranks_filter", false, true, G::user_code,
     "LOCAL_RANKS_FILTER", "(every rank)",
     "Only these local ranks' output on the console (e.g. 0,1); files keep everything."},
    {"duplicate_stdout_filters", "--duplicate-stdout-filters,--duplicate_stdout_filters", false,
     true, G::user_code, "DUPLICATE_STDOUT_FILTERS", "(none)",
     "Tee'd stdout lines containing any of these comma-separated words also go to "
     "filtered_stdout.log in the attempt's log folder (',,' is a comma)."},
    {"duplicate_stderr_filters", "--duplicate-stderr-filters,--duplicate_stderr_filters", false,
     true, G::user_code, "DUPLICATE_STDERR_FILTERS", "(none)",
     "The same for stderr, into filtered_stderr.log."},
    {"node_rank", "--node-rank,--node_rank", false, true, G::compat, "NODE_RANK", "0",
     "Rank of this node (static backend only)."},
    {"master_addr", "--master-addr,--master_addr", false, true, G::compat, "MASTER_ADDR",
     "127.0.0.1", "Host of node rank 0 (static backend only); IPv6 as [::1]."},
    {"master_port", "--master-port,--master_port", false, true, G::compat, "MASTER_PORT", "29500",
     "Port of node rank 0's store (static backend only); the workers' MASTER_PORT."},
    {"local_addr", "--local-addr,--local_addr", false, true, G::compat, "LOCAL_ADDR",
     "(this host's name)", "Address other nodes use to reach this one."},
    {"logs_specs", "--logs-specs,--logs_specs", false, false, G::compat, "LOGS_SPECS", "(none)",
     "torchrun's LogsSpecs plugin (a Python entry point): ddprun cannot load one and says so."},
    {"numa_binding", "--numa-binding,--numa_binding", false, false, G::compat,
     "{node,socket,exclusive,core-complex}", "off",
     "Bind each worker to the CPUs and memory near its GPU (hwloc); without GPUs, spread local "
     "ranks over NUMA nodes."},
    {"signals_to_handle", "--signals-to-handle,--signals_to_handle", false, true, G::compat,
     "SIGNALS_TO_HANDLE", "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
     "Signals that stop the job: the agent passes them to the workers and ends. SIGUSR1 and "
     "SIGUSR2 (Slurm's --signal=USR1@60) reach the workers without being listed and the job "
     "goes on; listed here they stop it."},
    {"shutdown_timeout", "--shutdown-timeout,--shutdown_timeout", false, true, G::compat,
     "SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT, else 30",
     "Seconds between the stop signal and SIGKILL when workers are stopped."},
    {"virtual_local_rank", "--virtual-local-rank,--virtual_local_rank", true, true, G::compat, "",
     "off", "Every worker sees LOCAL_RANK=0 and only its own GPU (CUDA_VISIBLE_DEVICES narrowed)."},
    {"print_completion", "--print-completion,--print_completion", false, false, G::completion,
     "{bash,zsh,tcsh}", "(none)",
     "Print a completion script for ddprun to stdout and exit (no extra package needed)."},
    {"max_nproc_per_node", "--max-nproc-per-node,--max_nproc_per_node", false, true, G::ddprun, "N",
     "min(1024, RLIMIT_NPROC/2, pid_max/16)",
     "ddprun's own: raises the bound on workers per node, up to min(65536, RLIMIT_NPROC, "
     "pid_max/2)."},
    {"per_worker_slurm_env", "--per-worker-slurm-env,--per_worker_slurm_env", true, true, G::ddprun,
     "", "off",
     "ddprun's own: under Slurm, give each worker SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, "
     "SLURM_NTASKS... from its ranks, for scripts that rank themselves by Slurm's variables."},
    {"hang_timeout", "--hang-timeout,--hang_timeout", false, true, G::ddprun, "SECONDS", "600",
     "ddprun's own: when no rank has made progress for this long, take every rank's stacks on "
     "every node and name the stuck ones (0: off). See docs/hangs.md."},
    {"on_hang", "--on-hang,--on_hang", false, true, G::ddprun, "{report,dump,restart,stop}",
     "report",
     "ddprun's own: after a hang report, go on (report), also keep the stacks (dump), restart "
     "the workers as after a failure (restart), or stop the job with exit code 124 (stop)."},
    {"straggler_factor", "--straggler-factor,--straggler_factor", false, true, G::ddprun, "FACTOR",
     "3",
     "ddprun's own: name a rank whose step time stays above FACTOR x the job's median (ranks "
     "that report steps; 0: off)."},
    {"status_interval", "--status-interval,--status_interval", false, true, G::ddprun, "SECONDS",
     "1",
     "ddprun's own: publish this node's status (ranks, steps, restarts, CPU/GPU) to the "
     "rendezvous store this often, for ddprun status and the live views (0: off). See "
     "docs/status.md."},
    {"store_outage_grace", "--store-outage-grace,--store_outage_grace", false, true, G::ddprun,
     "SECONDS", "300",
     "ddprun's own: while the rendezvous store is unreachable (restarted, stopped, cut off), the "
     "workers go on and the agent reconnects; it stops the job only after this long (0: at "
     "once). See docs/rendezvous.md."},
    {"http_port", "--http-port,--http_port", false, true, G::ddprun, "PORT", "off",
     "ddprun's own: serve the live page, /api/status and /metrics on this port (0: a free one, "
     "printed at start)."},
    {"http_host", "--http-host,--http_host", false, true, G::ddprun, "HOST",
     "where the store binds", "ddprun's own: the address --http-port binds."},
    {"http_token_file", "--http-token-file,--http_token_file", false, true, G::ddprun, "FILE",
     "the job's secret, if any",
     "ddprun's own: the live views ask for this token (a file of yours, mode 600) on every route "
     "but /healthz: `Authorization: Bearer`, or ?token= once in a browser (docs/security.md)."},
    {"http_tls_cert", "--http-tls-cert,--http_tls_cert", false, true, G::ddprun, "FILE", "(none)",
     "ddprun's own: serve the live views over HTTPS only, with this certificate chain (PEM) and "
     "--http-tls-key's key (docs/status.md)."},
    {"http_tls_key", "--http-tls-key,--http_tls_key", false, true, G::ddprun, "FILE", "(none)",
     "ddprun's own: the private key (PEM) of --http-tls-cert."},
    {"store_allow", "--store-allow,--store_allow", false, true, G::ddprun, "CIDRS", "(none)",
     "ddprun's own: networks (comma-separated CIDRs) whose clients may also use the stores this "
     "agent hosts without authenticating, besides loopback and the round's nodes "
     "(docs/security.md)."},
    {"store_allow_uids", "--store-allow-uids,--store_allow_uids", false, true, G::ddprun, "UIDS",
     "(this user and root)",
     "ddprun's own: other users (comma-separated uids or names) whose processes on this host may "
     "also use the stores this agent hosts over loopback; `any`: every local user, as torchrun "
     "(docs/security.md)."},
    {"trace", "--trace", false, true, G::ddprun, "FILE", "(none)",
     "ddprun's own: at exit, write a Chrome/Perfetto trace of every node's launcher phases and "
     "ranks' steps to FILE (written by group rank 0)."},
    {"use_env", "--use-env,--use_env", true, false, G::ddprun, "", "off",
     "torch.distributed.launch's, for `ddprun launch` (its stand-in): pass the local rank in "
     "LOCAL_RANK only, not as --local-rank=N before the script's arguments. Plain ddprun, as "
     "torchrun, always does."},
    {"gpu_job_mapping_dir", "--gpu-job-mapping-dir,--gpu_job_mapping_dir", false, true, G::ddprun,
     "DIR", "(none)",
     "ddprun's own: while the job runs, add its job id (SLURM_JOB_ID, else --rdzv-id) to the "
     "file of each GPU its workers use in DIR, as NVIDIA's DCGM exporter reads them "
     "(--hpc-job-mapping-dir), so GPU metrics carry the job; removed at exit."},
    {"progress", "--progress", false, true, G::ddprun, "{auto,tty,lines,off}", "auto",
     "ddprun's own: the local workers' progress line (step, samples/s, ETA): redrawn on a "
     "terminal (tty), a plain line every 10 s (lines), or auto (tty on a terminal, else lines); "
     "and the summary at exit (off: neither)."},
};

std::vector<std::string> names_of(const FlagSpec& s) {
  std::vector<std::string> out;
  std::stringstream in(s.names);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

// Wraps `text` at `width` columns, every line after the first indented by `indent`.
std::string wrap(const std::string& text, std::size_t indent, std::size_t width) {
  std::stringstream words(text);
  std::string word, out, line;
  while (words >> word) {
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line;
}

}  // namespace

const char* group_title(FlagGroup g) {
  switch (g) {
    case G::size: return "Worker/node size";
    case G::rendezvous: return "Rendezvous";
    case G::user_code: return "User-code launch";
    case G::compat: return "Backwards compatible (caffe2.distributed.launch) and node settings";
    case G::completion: return "Shell completion";
    case G::ddprun: return "ddprun's own";
  }
  return "";
}

std::span<const FlagSpec> flag_specs() { return kFlags; }

std::string long_name(const FlagSpec& s) {
  for (const auto& n : names_of(s)) {
    if (n.rfind("--", 0) == 0) return n;
  }
  return "";
}

std::string spelled_names(const FlagSpec& s) {
  std::string out;
  for (const auto& n : names_of(s)) out += (out.empty() ? "" : ", ") + n;
  return out;
}

std::string help_text() {
  std::string out =
      "usage: ddprun [options] training_script [training_script_args ...]\n"
      "       ddprun status --rdzv-endpoint HOST[:PORT] [--run-id ID] [--watch] [--json]\n"
      "                     (a running job's nodes and ranks; ddprun status --help)\n"
      "       ddprun launch [options] [--use-env] training_script [args ...]\n"
      "                     (python -m torch.distributed.launch's stand-in: --local-rank=N)\n\n"
      "A torchrun-compatible launcher: torchrun 2.15's flags, meanings and defaults.\n"
      "PET_<FLAG> environment variables give defaults for the flags marked (PET); the command\n"
      "line wins.\n\n"
      "positional arguments:\n"
      "  training_script       the program or Python script each worker runs, followed by its\n"
      "                        arguments ($local_rank and ${local_rank} are replaced)\n"
      "\n  -h, --help            show this help and exit\n"
      "  --version             show ddprun's version and exit\n";
  for (auto g : {G::size, G::rendezvous, G::user_code, G::compat, G::completion, G::ddprun}) {
    out += "\n" + std::string(group_title(g)) + ":\n";
    for (const auto& s : kFlags) {
      if (s.group != g) continue;
      std::string head = "  " + spelled_names(s);
      if (!s.is_switch) head += std::string(" ") + s.metavar;
      out += head + "\n" + std::string(24, ' ') + wrap(s.help, 24, 96) + "\n" +
             std::string(24, ' ') + "Default: " + s.fallback + (s.from_env ? " (PET)" : "") + "\n";
    }
  }
  return out;
}

std::string markdown_flag_table() {
  std::string out = "| flag | default | meaning |\n| --- | --- | --- |\n";
  for (auto g : {G::size, G::rendezvous, G::user_code, G::compat, G::completion, G::ddprun}) {
    for (const auto& s : kFlags) {
      if (s.group != g) continue;
      std::string names;
      for (const auto& n : names_of(s)) names += (names.empty() ? "`" : ", `") + n + "`";
      std::string meaning = s.help;
      for (std::size_t p = 0; (p = meaning.find('|', p)) != std::string::npos; p += 2) {
        meaning.replace(p, 1, "\\|");
      }
      out += "| " + names + " | " + s.fallback + " | " + meaning + " |\n";
    }
  }
  return out;
}

std::string completion_script(const std::string& shell) {
  std::string words;
  for (const auto& s : kFlags) {
    for (const auto& n : names_of(s)) words += (words.empty() ? "" : " ") + n;
  }
  words += " -h --help";
  if (shell == "bash") {
    return "# bash completion for ddprun (from `ddprun --print-completion bash`)\n"
           "_ddprun() {\n"
           "  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}\n"
           "  case $prev in\n"
           "    --start-method|--start_method) COMPREPLY=($(compgen -W 'spawn fork forkserver' "
           "-- \"$cur\")); return;;\n"
           "    --numa-binding|--numa_binding) COMPREPLY=($(compgen -W 'node socket exclusive "
           "core-complex' -- \"$cur\")); return;;\n"
           "    --rdzv-backend|--rdzv_backend) COMPREPLY=($(compgen -W 'static c10d etcd-v3' -- "
           "\"$cur\")); return;;\n"
           "    --print-completion|--print_completion) COMPREPLY=($(compgen -W 'bash zsh tcsh' "
           "-- \"$cur\")); return;;\n"
           "    --log-dir|--log_dir) COMPREPLY=($(compgen -d -- \"$cur\")); return;;\n"
           "  esac\n"
           "  if [[ $cur == -* ]]; then\n"
           "    COMPREPLY=($(compgen -W '" +
           words +
           "' -- \"$cur\"))\n"
           "  else\n"
           "    COMPREPLY=($(compgen -f -- \"$cur\"))\n"
           "  fi\n"
           "}\n"
           "complete -o filenames -F _ddprun ddprun\n";
  }
  if (shell == "zsh") {
    std::string out =
        "#compdef ddprun\n# zsh completion for ddprun (from `ddprun "
        "--print-completion zsh`)\n_arguments -S \\\n";
    for (const auto& s : kFlags) {
      for (const auto& n : names_of(s)) {
        out += "  '" + n + (s.is_switch ? "" : "=") + "[" + s.dest + "]" +
               (s.is_switch ? "" : ":" + std::string(s.dest) + ":") + "' \\\n";
      }
    }
    return out +
           "  '(-h --help)'{-h,--help}'[show the help]' \\\n  '1:script:_files' \\\n"
           "  '*::args:_files'\n";
  }
  if (shell == "tcsh") {
    std::string list;
    for (const auto& s : kFlags) {
      for (const auto& n : names_of(s)) {
        if (n.rfind("--", 0) == 0) list += (list.empty() ? "" : " ") + n.substr(2);
      }
    }
    return "# tcsh completion for ddprun (from `ddprun --print-completion tcsh`)\n"
           "complete ddprun 'c/--/(" +
           list + " help)/' 'p/*/f/'\n";
  }
  throw ConfigError("--print-completion: '" + shell + "' is not bash, zsh or tcsh");
}

}  // namespace ddp::launch
