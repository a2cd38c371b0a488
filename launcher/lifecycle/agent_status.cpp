// The agent's live status (agent_status.hpp): its settings from the command line, with the
// store the records go to (the TCP store or the etcd cluster), and each rank's GPU as NVML
// numbers it.
#include "agent_status.hpp"

#include <algorithm>

#include "ddp/launch/agent_etcd.hpp"
#include "ddp/launch/gpu_devices.hpp"
#include "ddp/proto/auth.hpp"
#include "ddp/proto/knobs.hpp"
#include "ddp/status/http_auth.hpp"

namespace ddp::launch {

using std::chrono::milliseconds;

// Each local rank's GPU as NVML numbers it (its place in the machine's bus-id order), for the
// GPU figures: torch's workers take cuda:LOCAL_RANK of the visible ones.
std::vector<int> nvml_indices(const EnvMap& env) {
  const auto machine = machine_gpus(nvidia_gpus_dir(env));
  std::vector<int> out;
  for (const GpuDevice& v : visible_gpus(machine, env)) {
    int index = -1;
    for (std::size_t i = 0; i < machine.size(); ++i) {
      if ((!v.pci_bus_id.empty() && v.pci_bus_id == machine[i].pci_bus_id) ||
          (!v.uuid.empty() && v.uuid == machine[i].uuid)) {
        index = static_cast<int>(i);
      }
    }
    out.push_back(index);
  }
  return out;
}

// The live status's settings from the command line (docs/status.md).
StatusSetup status_setup(const LaunchConfig& config, const EnvMap& env, const RendezvousStore& rs,
                         const WorkersAddr& workers, const rdzv::ClientOptions& client,
                         const std::optional<EtcdSettings>& etcd) {
  StatusSetup ss;
  ss.run_id = config.rdzv_id;
  ss.job_id = knobs::text("SLURM_JOB_ID", &env).value_or("");
  ss.host = hostname();
  ss.max_restarts = config.max_restarts;
  ss.interval_s = config.status_interval_s;
  if (etcd) {
    ss.store_where = "etcd " + rdzv::etcd::endpoints_text(etcd->options.endpoints);
    // Bounded as a publication to a TCP store is: a stopped cluster holds up no exit.
    ss.connect = [etcd = *etcd, t = std::min(client.timeout, milliseconds(3000))](bool) {
      return open_etcd_view(etcd, t);
    };
    ss.connect_view = [etcd = *etcd]() -> std::unique_ptr<rdzv::Store> {
      return open_etcd_view(etcd, milliseconds(3000));
    };
  } else if (rs.port != 0) {
    tcp_status_store(ss, rs.host, rs.port, client);
  }
  ss.http_port = config.http_port;
  if (config.http_tls_cert.empty() != config.http_tls_key.empty()) {
    throw ConfigError("--http-tls-cert and --http-tls-key go together");
  }
  ss.http_tls_cert = config.http_tls_cert;
  ss.http_tls_key = config.http_tls_key;
  if (config.http_port >= 0) {
    ss.http_token = status::views_token(config.http_token_file, proto::auth::job_secret());
  }
  ss.http_host = !config.http_host.empty() ? config.http_host
                 : rs.server               ? rs.server->host()
                 : !workers.bind.empty()   ? workers.bind
                                           : "127.0.0.1";
  if (rs.server) {
    rdzv::StoreServer* server = rs.server.get();
    ss.hosted_store_stats = [server] { return server->stats(); };
  }
  ss.trace_path = config.trace_path;
  ss.progress = parse_progress_mode(config.progress);
  return ss;
}

}  // namespace ddp::launch
