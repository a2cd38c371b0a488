// `ddprun status` (status_cli.hpp): its flags, one look at the job in the rendezvous store
// (three requests: status::read_job), and --watch, which redraws until SIGINT or SIGTERM.
#include "ddp/launch/status_cli.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "ddp/proto/auth.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/store_tls.hpp"
#include "ddp/status/job_view.hpp"

namespace ddp::launch {

namespace {

constexpr std::uint16_t kDefaultPort = 29400;  // c10d's, as the launcher's --rdzv-endpoint
constexpr auto kStoreTimeout = std::chrono::seconds(5);

// The store answers, but holds no such job (exit 1, its own message).
struct NoJob : std::runtime_error {
  using std::runtime_error::runtime_error;
};

bool is_one_of(const std::string& flag, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (flag == n) return true;
  }
  return false;
}

double parse_interval(const std::string& text) {
  const std::string what = "--interval '" + text + "': expected seconds from 0.1 to 3600";
  if (text.empty()) throw UsageError(what);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  // !(a <= v) also catches NaN.
  if (errno != 0 || end != text.c_str() + text.size() || !(v >= 0.1 && v <= 3600)) {
    throw UsageError(what);
  }
  return v;
}

// The job as the store has it; the run is chosen (the newest) when `run_id` is empty.
// Throws NoJob when the store holds no such job, ddp::Error when the store fails.
status::JobStatus look(rdzv::Store& store, std::string& run_id, const std::string& where) {
  if (run_id.empty()) {
    const auto runs = status::list_runs(store);
    if (runs.empty()) {
      throw NoJob("no ddprun job has published its status to " + where +
                  " (is a job running with --rdzv-endpoint " + where +
                  " and --status-interval above 0?)");
    }
    run_id = runs.back();
  }
  status::JobStatus job = status::read_job(store, run_id, status::unix_now());
  if (job.nodes.empty()) {
    std::string seen;
    for (const auto& r : status::list_runs(store, 5)) seen += (seen.empty() ? "" : ", ") + r;
    throw NoJob("no ddprun job with run id '" + run_id + "' has published its status to " + where +
                (seen.empty() ? "" : " (the newest runs there: " + seen + ")"));
  }
  return job;
}

std::string render(const status::JobStatus& job, bool json, bool compact) {
  return json ? status::to_json(job, compact ? -1 : 2) + "\n" : format_status_table(job);
}

// Sleeps until `seconds` have passed or SIGINT/SIGTERM (blocked in `set`) arrives: true then.
bool wait_for_stop(const sigset_t& set, double seconds) {
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    const std::chrono::duration<double> left = deadline - clock::now();
    if (left.count() <= 0) return false;
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(left.count());
    ts.tv_nsec = static_cast<long>((left.count() - static_cast<double>(ts.tv_sec)) * 1e9);
    const int sig = ::sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) return true;
    if (sig < 0 && errno == EAGAIN) return false;
  }
}

int watch(rdzv::Store& store, const StatusOptions& o, std::string run_id,
          const std::string& where) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  // Blocked, then taken with sigtimedwait: a signal during a look ends the watch after it.
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  const bool tty = !o.json && ::isatty(STDOUT_FILENO) == 1;
  for (bool first = true;; first = false) {
    status::JobStatus job;
    try {
      job = look(store, run_id, where);
    } catch (const Error& e) {
      std::cerr << "ddprun status: lost the rendezvous store at " << where << ": " << e.what()
                << "\n";
      return 1;
    }
    const std::string frame = render(job, o.json, true);
    if (tty) {
      std::cout << "\x1b[H\x1b[2J" << frame;
    } else {
      std::cout << (first || o.json ? "" : "\n") << frame;
    }
    std::cout.flush();
    if (wait_for_stop(set, o.interval_s)) return 0;
  }
}

}  // namespace

StatusOptions parse_status_args(const std::vector<std::string>& args) {
  StatusOptions o;
  std::optional<std::string> endpoint;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "-h" || a == "--help") {
      o.help = true;
      return o;
    }
    if (a.rfind("-", 0) != 0 || a == "-") {
      throw UsageError("unexpected argument '" + a + "' (ddprun status takes flags only)");
    }
    const auto eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    std::optional<std::string> inline_value;
    if (eq != std::string::npos) inline_value = a.substr(eq + 1);
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) throw UsageError(flag + " needs a value");
      return args[++i];
    };
    auto no_value = [&]() {
      if (inline_value) throw UsageError(flag + " takes no value (got '" + *inline_value + "')");
    };
    if (is_one_of(flag, {"--rdzv-endpoint", "--rdzv_endpoint"})) {
      endpoint = value();
    } else if (is_one_of(flag, {"--rdzv-backend", "--rdzv_backend"})) {
      o.backend = value();
      if (o.backend != "c10d" && o.backend != "etcd-v3") {
        throw UsageError(flag + " '" + o.backend + "': expected c10d or etcd-v3");
      }
    } else if (is_one_of(flag, {"--rdzv-conf", "--rdzv_conf"})) {
      const std::string text = value();
      std::size_t at = 0;
      while (at <= text.size()) {
        const std::size_t comma = std::min(text.find(',', at), text.size());
        const std::string kv = text.substr(at, comma - at);
        at = comma + 1;
        if (kv.empty()) continue;
        const auto e = kv.find('=');
        if (e == std::string::npos || e == 0) {
          throw UsageError(flag + ": '" + kv + "' is not KEY=VALUE");
        }
        o.rdzv_conf[kv.substr(0, e)] = kv.substr(e + 1);
      }
    } else if (is_one_of(flag, {"--run-id", "--run_id", "--rdzv-id", "--rdzv_id"})) {
      o.run_id = value();
      if (o.run_id.empty()) throw UsageError(flag + " needs a non-empty run id");
    } else if (flag == "--watch") {
      no_value();
      o.watch = true;
    } else if (flag == "--json") {
      no_value();
      o.json = true;
    } else if (flag == "--interval") {
      o.interval_s = parse_interval(value());
    } else {
      throw UsageError("unknown flag '" + flag + "' (see ddprun status --help)");
    }
  }
  if (!endpoint) throw UsageError("--rdzv-endpoint HOST[:PORT] is required");
  if (o.backend == "etcd-v3") {  // the members, checked where the cluster is opened
    if (endpoint->empty()) throw UsageError("--rdzv-endpoint: no etcd member given");
    o.members = *endpoint;
    return o;
  }
  if (!o.rdzv_conf.empty()) throw UsageError("--rdzv-conf is for --rdzv-backend etcd-v3");
  try {
    o.endpoint = rdzv::parse_endpoint(*endpoint, kDefaultPort, "--rdzv-endpoint");
  } catch (const ConfigError& e) {
    throw UsageError(e.what());
  }
  return o;
}

std::string status_usage() {
  return "usage: ddprun status --rdzv-endpoint HOST[:PORT] [--run-id ID] [--watch]\n"
         "                     [--interval SECONDS] [--json]\n"
         "                     [--rdzv-backend etcd-v3 [--rdzv-conf KEY=VALUE,...]]\n"
         "\n"
         "Shows a ddprun job while it runs, from its rendezvous store (a ddprund, or the agent\n"
         "that hosts the store): each node and rank with its state, restarts, step, step time,\n"
         "samples/s, CPU, RSS, GPU and last error. The agents publish it every\n"
         "--status-interval seconds.\n"
         "\n"
         "options:\n"
         "  --rdzv-endpoint HOST[:PORT]  the job's rendezvous store; port 29400 when left out\n"
         "                               (also --rdzv_endpoint); etcd-v3: its members\n"
         "  --rdzv-backend NAME           c10d (default: ddprund or the agent's store) or\n"
         "                               etcd-v3 (the job's etcd cluster)\n"
         "  --rdzv-conf KEY=VALUE,...      etcd-v3: the job's key_prefix, user, password_file,\n"
         "                               read_timeout, as the agents were given them\n"
         "  --run-id ID                  the job's --rdzv-id (also --rdzv-id, --rdzv_id,\n"
         "                               --run_id); default: the newest job the store has seen\n"
         "  --watch                      refresh until SIGINT (Ctrl-C) or SIGTERM: in place on a\n"
         "                               terminal, else one table per refresh after a blank line\n"
         "  --interval SECONDS           time between refreshes with --watch, 0.1 to 3600\n"
         "                               (default 1)\n"
         "  --json                       the job as JSON (docs/status.schema.json); with --watch\n"
         "                               one compact document per line\n"
         "  -h, --help                   show this help and exit\n"
         "\n"
         "exit status: 0 shown (or --watch ended by SIGINT/SIGTERM); 1 the store cannot be\n"
         "reached or holds no such job; 2 a bad flag\n";
}

int run_status_command(const std::vector<std::string>& args, const EtcdStatusStore& etcd) {
  StatusOptions o;
  try {
    o = parse_status_args(args);
  } catch (const Error& e) {
    std::cerr << "ddprun status: " << e.what() << "\n"
              << "usage: ddprun status --rdzv-endpoint HOST[:PORT] [--run-id ID] [--watch] "
                 "[--interval SECONDS] [--json]\n";
    return 2;
  }
  if (o.help) {
    std::cout << status_usage();
    return 0;
  }
  const bool on_etcd = o.backend == "etcd-v3";
  const std::string where = on_etcd ? "etcd " + o.members : o.endpoint.str();
  try {
    std::unique_ptr<rdzv::Store> store;
    if (on_etcd) {
      if (!etcd) {
        std::cerr << "ddprun status: --rdzv-backend etcd-v3 is not built into this program\n";
        return 2;
      }
      try {
        store = etcd(o);
      } catch (const ConfigError& e) {
        std::cerr << "ddprun status: " << e.what() << "\n";
        return 2;
      }
    } else {
      try {
        rdzv::ClientOptions co;
        co.secret = proto::auth::job_secret().value_or("");
        co.tls = rdzv::store_client_tls();
        co.timeout = kStoreTimeout;
        co.connect_timeout = kStoreTimeout;
        store = std::make_unique<rdzv::StoreClient>(o.endpoint, co);
      } catch (const ProtocolError&) {
        std::cerr << "ddprun status: " << where
                  << " answers, but it is not a ddprun rendezvous store (a torch TCPStore?)\n";
        return 1;
      }
    }
    if (o.watch) return watch(*store, o, o.run_id, where);
    std::string run_id = o.run_id;
    std::cout << render(look(*store, run_id, where), o.json, false);
    std::cout.flush();
    return 0;
  } catch (const NoJob& e) {
    std::cerr << "ddprun status: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ddprun status: cannot reach the rendezvous store at " << where << ": " << e.what()
              << "\n";
    return 1;
  }
}

}  // namespace ddp::launch
