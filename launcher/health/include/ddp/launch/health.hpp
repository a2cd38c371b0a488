// How the nodes' health summaries and stacks meet: O(1) store operations per node per check.
// Each node sets its summary (one SET) and reads the round's hang trigger (one GET-like
// CHECK/GET); the leader (group rank 0) reads every summary with one MULTI_GET. On a hang the
// leader sets the trigger (an epoch); every node then takes its workers' stacks and sets them
// (one SET); the leader reads them with one MULTI_GET and reports. A one-node job uses the
// in-memory bus: no store at all.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launch/hang_policy.hpp"
#include "ddp/rdzv/store.hpp"

namespace ddp::launch {

class HealthBus {
 public:
  virtual ~HealthBus() = default;
  virtual bool leader() const = 0;
  // Every node, every check.
  virtual void publish(const NodeSummary& s) = 0;
  // Leader: the latest summary of every node of the round (missing ones are absent).
  virtual std::vector<NodeSummary> collect() = 0;
  // Leader: asks every node for stacks (epoch > 0 and increasing).
  virtual void trigger(std::uint64_t epoch) = 0;
  // Every node: the newest epoch asked for (0: none).
  virtual std::uint64_t triggered() = 0;
  // Every node: its stacks for `epoch` (stacks_to_json of its workers, with their ranks).
  virtual void publish_stacks(std::uint64_t epoch, const std::string& json) = 0;
  // Leader: the nodes' stacks for `epoch` that have arrived, by group rank.
  virtual std::vector<std::pair<int, std::string>> collect_stacks(std::uint64_t epoch) = 0;
};

// Over the rendezvous store, under `prefix` (the run's and round's key space).
std::unique_ptr<HealthBus> store_health_bus(rdzv::Store& client, std::string prefix, int group_rank,
                                            int group_world_size);
// One node: nothing leaves the process.
std::unique_ptr<HealthBus> local_health_bus();

}  // namespace ddp::launch
