// torchrun 2.x's command line for ddprun: both spellings of every multi-word flag, torchrun's
// defaults, PET_<DEST> environment defaults (the command line wins), and validation with
// messages that name the flag. The only file of the launcher that uses the option parser.
#include <algorithm>
#include <limits>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include <CLI/CLI.hpp>

#include "cli_values.hpp"
#include "ddp/launch/etcd_conf.hpp"
#include "ddp/launch/cli_flags.hpp"
#include "ddp/launch/config.hpp"
#include "ddp/launch/limits.hpp"
#include "ddp/launch/slurm_env.hpp"
#include "ddp/launch/uuid.hpp"
#include "ddp/proto/version.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/knobs.hpp"
#include "ddp/proto/number.hpp"

namespace ddp::launch {
namespace {

std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep)) out.push_back(item);
  return out;
}

int to_int(const std::string& text, const std::string& flag) {
  return static_cast<int>(
      parse_int(text, flag, std::numeric_limits<int>::min(), std::numeric_limits<int>::max()));
}

Std to_std(const std::string& text, const std::string& flag) {
  int v = to_int(text, flag);
  if (v < 0 || v > 3) {
    throw ConfigError(flag + ": " + text + " is not 0 (none), 1 (out), 2 (err) or 3 (all)");
  }
  return static_cast<Std>(v);
}

StdSpec parse_std(const std::string& text, const std::string& flag) {
  StdSpec spec;
  if (text.find(':') == std::string::npos) {
    spec.all_ranks = to_std(text, flag);
    return spec;
  }
  for (const auto& item : split(text, ',')) {
    auto colon = item.find(':');
    if (colon == std::string::npos) {
      throw ConfigError(flag + ": '" + item + "' is not LOCAL_RANK:VALUE");
    }
    spec.per_rank[to_int(item.substr(0, colon), flag)] = to_std(item.substr(colon + 1), flag);
  }
  return spec;
}

int signal_number(const std::string& name) {
  static const std::map<std::string, int> kSignals = {
      {"SIGHUP", SIGHUP},   {"SIGINT", SIGINT},   {"SIGQUIT", SIGQUIT}, {"SIGTERM", SIGTERM},
      {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}, {"SIGALRM", SIGALRM}, {"SIGCONT", SIGCONT},
      {"SIGTSTP", SIGTSTP}, {"SIGXCPU", SIGXCPU}, {"SIGPWR", SIGPWR},   {"SIGWINCH", SIGWINCH},
  };
  auto it = kSignals.find(name);
  if (it == kSignals.end()) {
    throw ConfigError("--signals-to-handle: unknown or unforwardable signal '" + name + "'");
  }
  return it->second;
}

void validate_and_fill(LaunchConfig& c, const std::map<std::string, std::string>& raw,
                       const std::map<std::string, std::string>& env) {
  auto nn = split(raw.at("nnodes"), ':');
  if (nn.empty() || nn.size() > 2) {
    throw ConfigError("--nnodes: '" + raw.at("nnodes") + "' is not N or MIN:MAX");
  }
  c.min_nodes = to_int(nn[0], "--nnodes");
  c.max_nodes = nn.size() == 2 ? to_int(nn[1], "--nnodes") : c.min_nodes;
  if (c.min_nodes <= 0 || c.max_nodes < c.min_nodes) {
    throw ConfigError("--nnodes: need 0 < MIN <= MAX, got '" + raw.at("nnodes") + "'");
  }
  // torchrun: --standalone replaces whatever --rdzv-backend, --rdzv-endpoint and --rdzv-id said
  // (so they are not checked).
  if (c.standalone) {
    c.rdzv_backend = "c10d";
    c.rdzv_endpoint = "localhost:0";
    c.rdzv_id = random_uuid4();
    c.private_store = true;
  }
  const std::string& np = c.nproc_per_node;
  if (np != "cpu" && np != "gpu" && np != "auto" && to_int(np, "--nproc-per-node") <= 0) {
    throw ConfigError("--nproc-per-node: need a positive integer, cpu, gpu or auto, got '" + np +
                      "'");
  }
  if (c.rdzv_backend != "static" && c.rdzv_backend != "c10d" && c.rdzv_backend != "etcd-v3" &&
      c.rdzv_backend != "etcd" && c.rdzv_backend != "etcd-v2") {
    throw ConfigError("--rdzv-backend: '" + c.rdzv_backend +
                      "' is not supported (static, c10d or etcd-v3)");
  }
  if (c.max_restarts < 0) throw ConfigError("--max-restarts: must be >= 0");
  if (!(c.monitor_interval_s > 0)) throw ConfigError("--monitor-interval: must be > 0");
  if (c.start_method != "spawn" && c.start_method != "fork" && c.start_method != "forkserver") {
    throw ConfigError("--start-method: '" + c.start_method + "' is not spawn, fork or forkserver");
  }
  if (c.module && c.no_python) {
    throw ConfigError(
        "don't use both the '--no-python' flag and the '--module' flag at the same time");
  }
  if (c.node_rank < 0) throw ConfigError("--node-rank: must be >= 0");
  for (const auto& kv : split(raw.at("rdzv_conf"), ',')) {
    if (kv.empty()) continue;
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ConfigError("--rdzv-conf: '" + kv + "' is not KEY=VALUE");
    }
    c.rdzv_conf[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (raw.at("log_line_prefix_template") != kUnset) {
    c.log_line_prefix_template = raw.at("log_line_prefix_template");
  } else if (auto t = knobs::text("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", &env)) {
    c.log_line_prefix_template = *t;
  }
  c.redirects = parse_std(raw.at("redirects"), "--redirects");
  c.tee = parse_std(raw.at("tee"), "--tee");
  for (const auto& r : split(raw.at("local_ranks_filter"), ',')) {
    if (r.empty()) continue;
    const int rank = to_int(r, "--local-ranks-filter");
    auto& f = c.local_ranks_filter;
    if (std::find(f.begin(), f.end(), rank) == f.end()) f.push_back(rank);
  }
  if (raw.at("max_nproc_per_node") != kUnset) {
    c.max_nproc_per_node = to_int(raw.at("max_nproc_per_node"), "--max-nproc-per-node");
  }
  fill_newer_flags(c, raw);
  c.signals_to_handle_text = raw.at("signals_to_handle");
  for (const auto& s : split(raw.at("signals_to_handle"), ',')) {
    std::string name = s;
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (!name.empty()) c.signals_to_handle.push_back(signal_number(name));
  }
  if (c.entrypoint.empty()) {
    throw ConfigError("the following arguments are required: training_script");
  }
}

// Adds a line to the notice that ddprun prints on stderr before it starts (earliest first).
void add_notice(std::string& notice, const std::string& line) {
  notice = notice.empty() ? line : line + "\n" + notice;
}

// Under Slurm, with no endpoint given: the first host of the node list hosts the rendezvous.
// A multi-node job whose host cannot be derived stops here rather than becoming a world of
// one on localhost. Returns whether the host was used.
bool apply_slurm_endpoint(LaunchConfig& c, const SlurmDefaults& slurm, bool master_addr_given) {
  if (!c.rdzv_endpoint.empty() || c.etcd()) return false;  // etcd: its members are given
  const bool is_static = c.rdzv_backend == "static";
  if (is_static && (master_addr_given || c.max_nodes == 1)) return false;
  if (slurm.first_host.empty()) {
    if (c.max_nodes == 1 && !is_static) return false;  // endpoint() says it is required
    throw ConfigError("this is a " + std::to_string(c.max_nodes) +
                      "-node job but the rendezvous host cannot be derived from Slurm's "
                      "environment (" +
                      slurm.endpoint_problem +
                      "); give --rdzv-endpoint=HOST:PORT (or --master-addr for the static "
                      "backend) instead of letting every node start alone");
  }
  (is_static ? c.master_addr : c.rdzv_endpoint) = slurm.first_host;
  return true;
}

// The parsed config with Slurm's defaults in place: checks what they could not supply, undoes
// the node-count defaults for --standalone, fills the endpoint. Returns the notice line naming
// the values Slurm supplied that stayed in effect.
std::string apply_slurm(LaunchConfig& c, const SlurmDefaults& slurm,
                        std::map<std::string, CLI::Option*>& opts) {
  auto dest_of = [](const std::string& arg) {
    std::string d =
        arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
    std::replace(d.begin(), d.end(), '-', '_');
    return d;
  };
  auto from_slurm = [&](const std::string& dest) {
    return std::any_of(slurm.args.begin(), slurm.args.end(),
                       [&](const std::string& a) { return dest_of(a) == dest; });
  };
  // Given on the command line or in PET_*: more occurrences than Slurm's own.
  auto given = [&](const std::string& dest) {
    return opts.at(dest)->count() > (from_slurm(dest) ? 1U : 0U);
  };
  for (const auto& [flag, why] : slurm.problems) {
    if (!given(dest_of(flag))) throw ConfigError(why + " (or give " + flag + ")");
  }
  if (!slurm.layout_problem.empty() && !given("nnodes")) throw ConfigError(slurm.layout_problem);
  auto kept = [&](const std::string& dest) {
    if (given(dest)) return false;
    return !(c.standalone && (dest == "nnodes" || dest == "node_rank" || dest == "rdzv_id"));
  };
  if (c.standalone) {  // one node on its own: only the worker count comes from Slurm
    if (!given("nnodes")) c.min_nodes = c.max_nodes = 1;
    if (!given("node_rank")) c.node_rank = 0;
  }
  if (c.rdzv_backend == "static" && !c.standalone && from_slurm("node_rank") &&
      !given("node_rank") && c.node_rank >= c.max_nodes) {
    throw ConfigError("--nnodes=" + std::to_string(c.max_nodes) + " is given, but this is node " +
                      std::to_string(c.node_rank) +
                      " of the Slurm step (its --node-rank from SLURM_*): give --node-rank "
                      "too, or leave --nnodes to Slurm");
  }
  std::string used;
  for (const auto& a : slurm.args) {
    if (kept(dest_of(a))) used += " " + a;
  }
  if (!c.standalone && apply_slurm_endpoint(c, slurm, given("master_addr"))) {
    used += " rendezvous host " + slurm.first_host;
  }
  if (used.empty()) used = " none (flags and PET_* gave everything)";
  return "ddprun: Slurm job " + slurm.job + ": defaults from SLURM_*:" + used +
         " (flags and PET_* override them)";
}

}  // namespace

Std StdSpec::for_rank(int local_rank) const {
  if (all_ranks) return *all_ranks;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? Std::none : it->second;
}

Endpoint resolve_endpoint(const LaunchConfig& c) {
  if (c.rdzv_endpoint.empty()) {
    if (c.rdzv_backend == "static") {  // torchrun's IPv6 form [::1] loses its brackets
      const std::string& a = c.master_addr;
      const bool bracketed = a.size() > 2 && a.front() == '[' && a.back() == ']';
      return {bracketed ? a.substr(1, a.size() - 2) : a, c.master_port};
    }
    throw ConfigError(
        "--rdzv-endpoint is required for --rdzv-backend=" + c.rdzv_backend +
        (c.etcd() ? " (the etcd members: HOST[:PORT],...)" : " (or use --standalone)"));
  }
  if (c.etcd()) return etcd_members(c).front();
  return parse_endpoint(c.rdzv_endpoint, c.rdzv_backend == "c10d" ? 29400 : c.master_port,
                        "--rdzv-endpoint");
}

ParseResult parse_launch_args(const std::vector<std::string>& argv,
                              const std::map<std::string, std::string>& env) {
  LaunchConfig c;
  std::map<std::string, std::string> raw = {{"nnodes", "1:1"},
                                            {"rdzv_conf", ""},
                                            {"redirects", "0"},
                                            {"tee", "0"},
                                            {"local_ranks_filter", ""},
                                            {"duplicate_stdout_filters", kUnset},
                                            {"duplicate_stderr_filters", kUnset},
                                            {"signals_to_handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
                                            {"event_log_handler", "null"},
                                            {"logs_specs", kUnset},
                                            {"numa_binding", ""},
                                            {"shutdown_timeout", kUnset},
                                            {"print_completion", kUnset},
                                            {"hang_timeout", "600"},
                                            {"on_hang", "report"},
                                            {"straggler_factor", "3"},
                                            {"status_interval", "1"},
                                            {"store_outage_grace", "300"},
                                            {"http_port", kUnset},
                                            {"http_host", kUnset},
                                            {"store_allow", kUnset},
                                            {"store_allow_uids", kUnset},
                                            {"http_token_file", kUnset},
                                            {"http_tls_cert", kUnset},
                                            {"http_tls_key", kUnset},
                                            {"trace", kUnset},
                                            {"gpu_job_mapping_dir", kUnset},
                                            {"progress", "auto"},
                                            {"log_line_prefix_template", kUnset},
                                            {"max_nproc_per_node", kUnset}};
  CLI::App app{"ddprun: a torchrun-compatible launcher", "ddprun"};
  app.prefix_command();  // the first positional is the entrypoint; the rest are its arguments
  app.allow_extras(false);
  std::map<std::string, CLI::Option*> opts;
  auto value = [&](const FlagSpec& s, auto& target) {
    opts[s.dest] =
        app.add_option(s.names, target)->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  auto text = [&](const FlagSpec& s) {
    opts[s.dest] =
        app.add_option(s.names, raw[s.dest])->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  auto flag = [&](const FlagSpec& s, bool& target) {
    opts[s.dest] = app.add_flag(s.names, target);
  };
  const std::map<std::string, bool*> switches = {{"standalone", &c.standalone},
                                                 {"module", &c.module},
                                                 {"no_python", &c.no_python},
                                                 {"run_path", &c.run_path},
                                                 {"use_env", &c.use_env},
                                                 {"virtual_local_rank", &c.virtual_local_rank},
                                                 {"per_worker_slurm_env", &c.per_worker_slurm_env}};
  for (const auto& s : flag_specs()) {
    std::string d = s.dest;
    if (s.is_switch)
      flag(s, *switches.at(d));
    else if (d == "nproc_per_node")
      value(s, c.nproc_per_node);
    else if (d == "rdzv_backend")
      value(s, c.rdzv_backend);
    else if (d == "rdzv_endpoint")
      value(s, c.rdzv_endpoint);
    else if (d == "rdzv_id")
      value(s, c.rdzv_id);
    else if (d == "max_restarts")
      value(s, c.max_restarts);
    else if (d == "monitor_interval")
      value(s, c.monitor_interval_s);
    else if (d == "start_method")
      value(s, c.start_method);
    else if (d == "role")
      value(s, c.role);
    else if (d == "log_dir")
      value(s, c.log_dir);
    else if (d == "node_rank")
      value(s, c.node_rank);
    else if (d == "master_addr")
      value(s, c.master_addr);
    else if (d == "master_port")
      value(s, c.master_port);
    else if (d == "local_addr")
      value(s, c.local_addr);
    else
      text(s);
  }

  // Slurm's environment, then PET_<DEST>, supply defaults: they go in front, so the command
  // line (later) wins.
  auto truthy = [](const std::string& v) { return v == "1" || v == "true" || v == "True"; };
  const SlurmDefaults slurm = slurm_defaults(env);
  std::vector<std::string> args = slurm.args;
  for (const auto& s : flag_specs()) {
    if (!s.from_env) continue;  // torchrun reads no PET_* for these
    auto it = env.find("PET_" + upper(s.dest));
    if (it == env.end()) continue;
    if (s.is_switch) {
      if (truthy(it->second)) {
        args.push_back(long_name(s));
      }
    } else if (it->second.empty()) {
      args.push_back(long_name(s));  // CLI11 reads "--opt=" as "take the next argument"
      args.emplace_back();
    } else {
      args.push_back(long_name(s) + "=" + it->second);
    }
  }
  for (std::size_t i = 1; i < argv.size(); ++i) {
    // CLI11 reads "--opt=" (empty) as "take the next argument"; an empty template is valid.
    if (argv[i] == "--log-line-prefix-template=" || argv[i] == "--log_line_prefix_template=") {
      args.push_back(argv[i].substr(0, argv[i].size() - 1));
      args.emplace_back();
      continue;
    }
    args.push_back(argv[i]);
  }

  ParseResult result;
  if (argv.size() == 2 && argv[1] == "--help-markdown") {  // docs/launcher.md's flag table
    result.message = markdown_flag_table();
    return result;
  }
  if (argv.size() == 2 && argv[1] == "--version") {  // torchrun has none: nothing to shadow
    result.message = version_line("ddprun");
    return result;
  }
  try {
    std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 pops from the back
    app.parse(reversed);
    auto rest = app.remaining();
    // prefix_command stops at the first argument it does not know: an option there is a typo
    // of ours, not the entrypoint.
    if (!rest.empty() && rest.front() != "--" && rest.front().size() > 1 &&
        rest.front()[0] == '-') {
      throw ConfigError("unknown option '" + rest.front() + "' (options go before the script)");
    }
    if (raw.at("print_completion") != kUnset) {  // torchrun: prints and exits while parsing
      result.message = completion_script(raw.at("print_completion"));
      result.exit_code = 0;
      return result;
    }
    if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());
    if (!rest.empty()) {
      c.entrypoint = rest.front();
      c.args.assign(rest.begin() + 1, rest.end());
    }
    c.master_port_given = opts.at("master_port")->count() > 0;
    validate_and_fill(c, raw, env);
    if (slurm.active) result.notice = apply_slurm(c, slurm, opts);
    // torch 2.15 (run.py's run()): static with no endpoint and no --master-port on one node
    // becomes c10d on a free local port with a fresh run id, as --standalone does (under
    // Slurm the run id stays the job's, a ddprun default torchrun does not have).
    if (c.rdzv_backend == "static" && c.rdzv_endpoint.empty() && !c.master_port_given &&
        c.max_nodes == 1 && !c.standalone) {
      c.rdzv_backend = "c10d";
      c.rdzv_endpoint = "localhost:0";
      if (!slurm.active) c.rdzv_id = random_uuid4();
      c.private_store = true;
    }
    if (c.rdzv_backend == "etcd" || c.rdzv_backend == "etcd-v2") {
      add_notice(result.notice,
                 "ddprun: --rdzv-backend=" + c.rdzv_backend +
                     " runs as etcd-v3 (etcd's v3 API; torchrun's v2 keys are not used)");
      c.rdzv_backend = "etcd-v3";
    }
    for (int s : {SIGUSR1, SIGUSR2}) {
      const auto& h = c.signals_to_handle;
      if (std::find(h.begin(), h.end(), s) == h.end()) continue;
      const std::string name = s == SIGUSR1 ? "SIGUSR1" : "SIGUSR2";
      add_notice(result.notice, "ddprun: warning: --signals-to-handle lists " + name +
                                    ": it will stop the job. "
                                    "Without it " +
                                    name +
                                    " reaches the workers and the job goes on (Slurm's "
                                    "--signal=USR1@60 to save a checkpoint)");
    }
    c.rdzv = resolve_endpoint(c);  // the one parse: a malformed endpoint fails now
    if (c.etcd()) c.etcd_members = etcd_members(c);
    check_counts(c);
    result.config = std::move(c);
  } catch (const CLI::CallForHelp&) {
    result.message = help_text();
    result.exit_code = 0;
  } catch (const CLI::ParseError& e) {
    result.message = std::string("ddprun: ") + e.what() + "\nRun with --help for the options.";
    result.exit_code = 2;
  } catch (const ConfigError& e) {
    result.message = std::string("ddprun: ") + e.what();
    result.exit_code = 2;
  }
  return result;
}

}  // namespace ddp::launch
