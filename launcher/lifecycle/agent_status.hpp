// The agent's live status (docs/status.md): the StatusReporter's settings from the command
// line, and the GPU each local rank uses as NVML numbers it. Private to the launcher.
#pragma once

#include <optional>
#include <vector>

#include "ddp/launch/agent.hpp"
#include "ddp/launch/etcd_conf.hpp"
#include "ddp/launch/master_addr.hpp"
#include "ddp/launch/status_reporter.hpp"

#include "agent_store.hpp"

namespace ddp::launch {

// Each local rank's GPU as NVML numbers it (its place in the machine's bus-id order), for the
// GPU figures: torch's workers take cuda:LOCAL_RANK of the visible ones.
std::vector<int> nvml_indices(const EnvMap& env);

// The live status's settings: the records go to the rendezvous store (`rs`, or the etcd
// cluster when `etcd` is set), the page listens where the workers' side does.
StatusSetup status_setup(const LaunchConfig& config, const EnvMap& env, const RendezvousStore& rs,
                         const WorkersAddr& workers, const rdzv::ClientOptions& client,
                         const std::optional<EtcdSettings>& etcd);

}  // namespace ddp::launch
