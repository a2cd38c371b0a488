// The health buses of health.hpp. Over the store, under the round's prefix P:
//   P/health/<group rank>           each node's latest summary (SET every check)
//   P/hang                          the newest stacks epoch asked for, ASCII decimal
//   P/stacks/<epoch>/<group rank>   each node's stacks for that epoch
// Store requests (server.stats().requests), per check:
//   every node    publish: 1 (SET)
//   non-leader    triggered: 1 (COMPARE_SET with expected == desired: a read that never waits
//                 and never writes; a missing key reads as the expected "0")
//   leader        triggered: 0 (it is the only writer of P/hang, so it answers from memory);
//                 collect: 2 (WAIT, answered at once, then MULTI_GET)
// so 2 per node and check, plus the leader's collect. Once per round the leader's construction
// sends 1 MULTI_SET; per hang: trigger 1 (MULTI_SET), each node's stacks 1 (SET), the leader's
// collect_stacks 2 (WAIT + MULTI_GET).
// StoreClient::multi_get always WAITs for every key first, so the leader makes sure its keys
// exist before it reads them: at construction it creates every P/health/<g> empty, and the
// trigger creates every P/stacks/<epoch>/<g> empty in the same MULTI_SET that sets P/hang
// (last, so a node that sees the epoch finds its stacks key there). An empty value reads as
// "not arrived". Creating P/health/<g> may overwrite a summary a node published before the
// leader was up; the node publishes again at its next check, and until then collect() lacks it,
// as for any node that has not published yet.
#include "ddp/launch/health.hpp"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"

namespace ddp::launch {

namespace {

[[noreturn]] void leader_only(const char* what) {
  throw ConfigError(std::string("health bus: ") + what + " is the leader's (group rank 0) to call");
}

std::uint64_t parse_epoch(const std::string& text, const std::string& key) {
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw ProtocolError("health bus: " + key + " holds '" + text.substr(0, 40) +
                        "', not a stacks epoch");
  }
  return v;
}

class StoreHealthBus final : public HealthBus {
 public:
  StoreHealthBus(rdzv::Store& client, std::string prefix, int group_rank, int world)
      : client_(client), prefix_(std::move(prefix)), group_rank_(group_rank), world_(world) {
    if (world_ < 1 || group_rank_ < 0 || group_rank_ >= world_) {
      throw ConfigError("health bus: group rank " + std::to_string(group_rank_) +
                        " of a group of " + std::to_string(world_));
    }
    for (int g = 0; g < world_; ++g) health_keys_.push_back(health_key(g));
  }

  bool leader() const override { return group_rank_ == 0; }

  void publish(const NodeSummary& s) override {
    make_keys();
    client_.set(health_key(group_rank_), encode_summary(s));
  }

  std::vector<NodeSummary> collect() override {
    if (!leader()) leader_only("collect()");
    make_keys();
    auto values = client_.multi_get(health_keys_);
    std::vector<NodeSummary> out;
    for (std::size_t g = 0; g < values.size(); ++g) {
      if (values[g].empty()) continue;
      try {
        out.push_back(decode_summary(values[g]));
      } catch (const ProtocolError& e) {
        throw ProtocolError("node " + std::to_string(g) + " (" + health_keys_[g] +
                            "): " + e.what());
      }
      if (out.back().group_rank != static_cast<int>(g)) {
        throw ProtocolError(health_keys_[g] + " holds the summary of group rank " +
                            std::to_string(out.back().group_rank));
      }
    }
    return out;
  }

  void trigger(std::uint64_t epoch) override {
    if (!leader()) leader_only("trigger()");
    if (epoch == 0 || epoch <= last_epoch_) {
      throw ConfigError("health bus: stacks epoch " + std::to_string(epoch) +
                        " must be above the last one (" + std::to_string(last_epoch_) + ")");
    }
    std::vector<std::string> keys, values;
    for (int g = 0; g < world_; ++g) keys.push_back(stacks_key(epoch, g));
    values.resize(keys.size());
    keys.push_back(hang_key());
    values.push_back(std::to_string(epoch));
    client_.multi_set(keys, values);
    last_epoch_ = epoch;
    epochs_.insert(epoch);
  }

  std::uint64_t triggered() override {
    if (leader()) return last_epoch_;
    return parse_epoch(client_.compare_set(hang_key(), "0", "0"), hang_key());
  }

  void publish_stacks(std::uint64_t epoch, const std::string& stacks_json) override {
    client_.set(stacks_key(epoch, group_rank_), stacks_json);
  }

  std::vector<std::pair<int, std::string>> collect_stacks(std::uint64_t epoch) override {
    if (!leader()) leader_only("collect_stacks()");
    std::vector<std::pair<int, std::string>> out;
    if (!epochs_.count(epoch)) return out;  // never asked for: its keys do not exist
    std::vector<std::string> keys;
    for (int g = 0; g < world_; ++g) keys.push_back(stacks_key(epoch, g));
    auto values = client_.multi_get(keys);
    for (std::size_t g = 0; g < values.size(); ++g) {
      if (!values[g].empty()) out.emplace_back(static_cast<int>(g), std::move(values[g]));
    }
    return out;
  }

 private:
  // The leader makes every node's key (empty) before its first collect(), so that a node yet
  // to publish reads as absent. Done on first use, not when the bus is made: a store away at
  // the round's start (the agent rides it out) then costs one check, not the agent.
  void make_keys() {
    if (!leader() || keys_made_) return;
    client_.multi_set(health_keys_, std::vector<std::string>(health_keys_.size()));
    keys_made_ = true;
  }
  std::string health_key(int g) const { return prefix_ + "/health/" + std::to_string(g); }
  std::string hang_key() const { return prefix_ + "/hang"; }
  std::string stacks_key(std::uint64_t epoch, int g) const {
    return prefix_ + "/stacks/" + std::to_string(epoch) + "/" + std::to_string(g);
  }

  rdzv::Store& client_;
  std::string prefix_;
  int group_rank_;
  int world_;
  std::vector<std::string> health_keys_;
  std::uint64_t last_epoch_ = 0;
  bool keys_made_ = false;
  std::set<std::uint64_t> epochs_;  // the epochs this leader triggered
};

// One node: the leader of itself; summaries and stacks stay in memory.
class LocalHealthBus final : public HealthBus {
 public:
  bool leader() const override { return true; }
  void publish(const NodeSummary& s) override { last_ = s; }
  std::vector<NodeSummary> collect() override {
    if (!last_) return {};
    return {*last_};
  }
  void trigger(std::uint64_t epoch) override {
    if (epoch == 0 || epoch <= epoch_) {
      throw ConfigError("health bus: stacks epoch " + std::to_string(epoch) +
                        " must be above the last one (" + std::to_string(epoch_) + ")");
    }
    epoch_ = epoch;
  }
  std::uint64_t triggered() override { return epoch_; }
  void publish_stacks(std::uint64_t epoch, const std::string& stacks_json) override {
    stacks_[epoch] = stacks_json;
  }
  std::vector<std::pair<int, std::string>> collect_stacks(std::uint64_t epoch) override {
    auto it = stacks_.find(epoch);
    if (it == stacks_.end() || it->second.empty()) return {};
    return {{last_ ? last_->group_rank : 0, it->second}};
  }

 private:
  std::optional<NodeSummary> last_;
  std::uint64_t epoch_ = 0;
  std::map<std::uint64_t, std::string> stacks_;
};

}  // namespace

std::unique_ptr<HealthBus> store_health_bus(rdzv::Store& client, std::string prefix, int group_rank,
                                            int group_world_size) {
  return std::make_unique<StoreHealthBus>(client, std::move(prefix), group_rank, group_world_size);
}

std::unique_ptr<HealthBus> local_health_bus() { return std::make_unique<LocalHealthBus>(); }

}  // namespace ddp::launch
