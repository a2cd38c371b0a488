// The status records' place in the store (job_view.hpp): a slot per agent, one SET per
// interval, and a reader that gets the whole job in three requests.
#include "ddp/status/job_view.hpp"

#include <algorithm>
#include <chrono>
#include <set>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/store.hpp"

namespace ddp::status {

namespace {
const std::string kRoot = "/ddprun/status/";
std::string run_prefix(const std::string& run_id) { return kRoot + run_id + "/"; }
}  // namespace

std::string runs_key() { return kRoot + "runs"; }
std::string node_key(const std::string& run_id, int slot) {
  return run_prefix(run_id) + "node/" + std::to_string(slot);
}
std::string history_key(const std::string& run_id, int slot) {
  return run_prefix(run_id) + "history/" + std::to_string(slot);
}
std::string trace_key(const std::string& run_id, int slot) {
  return run_prefix(run_id) + "trace/" + std::to_string(slot);
}

double unix_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

void join(rdzv::Store& store, NodeStatus& n) {
  const std::int64_t taken = store.add(run_prefix(n.run_id) + "slots", 1);
  n.slot = static_cast<int>(taken - 1);
  publish(store, n, unix_now(), true);
  store.append(run_prefix(n.run_id) + "index", std::to_string(n.slot) + ",");
  if (n.slot == 0) store.append(runs_key(), n.run_id + "\n");
}

void rejoin(rdzv::Store& store, NodeStatus& n) {
  const bool kept = store.check({node_key(n.run_id, n.slot)});
  publish(store, n, unix_now(), true);
  if (kept) return;
  // The store came back empty: this slot is taken again, for readers and for later agents.
  rdzv::raise_counter(store, run_prefix(n.run_id) + "slots", n.slot + 1);
  store.append(run_prefix(n.run_id) + "index", std::to_string(n.slot) + ",");
  if (n.slot == 0) store.append(runs_key(), n.run_id + "\n");
}

void publish(rdzv::Store& store, NodeStatus& n, double now_unix, bool history) {
  ++n.seq;
  n.updated_unix = now_unix;
  // The history first: a reader that finds the record finds its history too.
  if (history || n.seq % kHistoryEvery == 0 || final_state(n.state)) {
    store.set(history_key(n.run_id, n.slot), to_json(n.history));
  }
  store.set(node_key(n.run_id, n.slot), to_json(n, false));
}

std::vector<int> parse_index(const std::string& text) {
  std::vector<int> out;
  std::set<int> seen;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    if (item.empty() || item.size() > 9 ||
        !std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      continue;
    }
    const int slot = std::stoi(item);
    if (seen.insert(slot).second) out.push_back(slot);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> parse_runs(const std::string& text, std::size_t max) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string id = text.substr(at, end - at);
    at = end + 1;
    if (!id.empty() && seen.insert(id).second) out.push_back(std::move(id));
  }
  if (out.size() > max) out.erase(out.begin(), out.end() - static_cast<std::ptrdiff_t>(max));
  return out;
}

namespace {

// The nodes' histories, for the nodes read: one CHECK of them all and one MULTI_GET (an agent
// from before issue 36 writes none: then one CHECK each, since a GET of a missing key waits).
void read_histories(rdzv::Store& store, JobStatus& job) {
  std::vector<std::string> keys;
  std::vector<NodeStatus*> owners;
  for (auto& n : job.nodes) {
    keys.push_back(history_key(job.run_id, n.slot));
    owners.push_back(&n);
  }
  if (!keys.empty() && !store.check(keys)) {  // not all there: one CHECK each
    std::vector<std::string> there;
    std::vector<NodeStatus*> theirs;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (!store.check({keys[i]})) continue;
      there.push_back(keys[i]);
      theirs.push_back(owners[i]);
    }
    keys = std::move(there);
    owners = std::move(theirs);
  }
  if (keys.empty()) return;
  const auto values = store.multi_get(keys);
  for (std::size_t i = 0; i < values.size(); ++i) {
    try {
      owners[i]->history = series_from_json(values[i]);
    } catch (const ProtocolError&) {
      // A history this reader cannot read is left out, as a record would be.
    }
  }
}

}  // namespace

JobStatus read_job(rdzv::Store& store, const std::string& run_id, double now_unix, bool history) {
  JobStatus job;
  job.run_id = run_id;
  job.now_unix = now_unix;
  const std::string index = run_prefix(run_id) + "index";
  if (store.check({index})) {
    std::vector<std::string> keys;
    for (int slot : parse_index(store.get(index))) keys.push_back(node_key(run_id, slot));
    if (!keys.empty()) {
      const auto values = store.multi_get(keys);  // every indexed record exists (set first)
      for (const auto& v : values) {
        try {
          job.nodes.push_back(node_from_json(v, false));
        } catch (const ProtocolError&) {
          // A record this reader cannot read (a newer schema, say) is left out, not fatal.
        }
      }
      if (history) read_histories(store, job);
    }
  }
  fill_derived(job);
  return job;
}

std::vector<std::string> list_runs(rdzv::Store& store, std::size_t max) {
  if (!store.check({runs_key()})) return {};
  return parse_runs(store.get(runs_key()), max);
}

}  // namespace ddp::status
