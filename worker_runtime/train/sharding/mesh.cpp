// The 2-D device mesh (--mesh dp=D,tp=T, issue 20): parse_mesh reads the flag, place_mesh orders
// the ranks host by host and cuts that order into tensor-parallel rows of T, make_mesh_comms
// gathers the host names over the world and connects this rank's row and column (Gloo, with
// shared memory when a group is on one host and `shm`; or NCCL), and CountingCommunicator
// counts each collective's bytes. The contract is mesh.hpp.
#include "mesh.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <map>
#include <numeric>
#include <utility>

#include "ddp/proto/error.hpp"

namespace ddp::train {
namespace {

std::string quoted(std::string_view text) { return "--mesh \"" + std::string(text) + "\""; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// A positive integer of at most kMaxMeshDim, digits only.
int parse_dim(std::string_view text, std::string_view key, std::string_view value) {
  const auto bad = [&](const std::string& why) {
    return ConfigError(quoted(text) + ": " + std::string(key) + "=" + std::string(value) + " " +
                       why);
  };
  if (value.empty()) throw bad("has no value (a positive integer expected)");
  long v = 0;
  for (const char c : value) {
    if (c < '0' || c > '9') throw bad("is not a positive integer");
    v = v * 10 + (c - '0');
    if (v > kMaxMeshDim) {
      throw bad("is past the largest mesh dimension, " + std::to_string(kMaxMeshDim));
    }
  }
  if (v < 1) throw bad("is not a positive integer");
  return static_cast<int>(v);
}

std::string group_text(const std::vector<int>& ranks) {
  std::string s = "[";
  for (std::size_t k = 0; k < ranks.size(); ++k) {
    if (k > 0) s += ' ';
    s += std::to_string(ranks[k]);
  }
  return s + "]";
}

}  // namespace

MeshShape parse_mesh(std::string_view text, int world) {
  if (world < 1) {
    throw ConfigError(quoted(text) + ": the world has " + std::to_string(world) +
                      " ranks (at least 1 expected)");
  }
  const std::string_view whole = trim(text);
  if (whole.empty()) return MeshShape{world, 1};
  int dp = 0;  // 0: not given
  int tp = 0;
  std::string_view rest = whole;
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    const auto eq = item.find('=');
    if (item.empty() || eq == std::string_view::npos) {
      throw ConfigError(quoted(text) + ": \"" + std::string(item) +
                        "\" is not key=value (dp=D,tp=T expected)");
    }
    const std::string_view key = trim(item.substr(0, eq));
    const std::string_view value = trim(item.substr(eq + 1));
    int* slot = key == "dp" ? &dp : key == "tp" ? &tp : nullptr;
    if (slot == nullptr) {
      throw ConfigError(quoted(text) + ": unknown key \"" + std::string(key) +
                        "\" (dp and tp expected)");
    }
    if (*slot != 0) {
      throw ConfigError(quoted(text) + ": " + std::string(key) + " is given twice");
    }
    *slot = parse_dim(text, key, value);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  const std::string w = std::to_string(world);
  if (dp == 0 || tp == 0) {
    const int given = dp == 0 ? tp : dp;
    if (world % given != 0) {
      throw ConfigError(quoted(text) + ": " + (dp == 0 ? "tp=" : "dp=") + std::to_string(given) +
                        " does not divide the world's " + w + " ranks");
    }
    if (dp == 0) dp = world / tp;
    if (tp == 0) tp = world / dp;
  }
  if (static_cast<long>(dp) * tp != world) {
    throw ConfigError(quoted(text) + ": dp x tp = " + std::to_string(dp) + " x " +
                      std::to_string(tp) + " = " + std::to_string(static_cast<long>(dp) * tp) +
                      ", but the world has " + w + " ranks");
  }
  return MeshShape{dp, tp};
}

MeshPlace place_mesh(const std::vector<std::string>& hosts, MeshShape shape) {
  const std::string dims = "dp=" + std::to_string(shape.dp) + ",tp=" + std::to_string(shape.tp);
  if (shape.dp < 1 || shape.tp < 1 || shape.dp > kMaxMeshDim || shape.tp > kMaxMeshDim) {
    throw ConfigError("--mesh " + dims + ": each dimension must be in 1.." +
                      std::to_string(kMaxMeshDim));
  }
  const std::size_t n = static_cast<std::size_t>(shape.dp) * static_cast<std::size_t>(shape.tp);
  if (hosts.size() != n) {
    throw ConfigError("--mesh " + dims + ": dp x tp = " + std::to_string(n) +
                      ", but the world has " + std::to_string(hosts.size()) + " ranks");
  }
  // Ranks host by host: hosts in the order of their lowest rank, within a host by rank.
  std::map<std::string, std::size_t> host_index;
  std::vector<std::vector<int>> by_host;
  for (std::size_t r = 0; r < n; ++r) {
    const auto [it, fresh] = host_index.emplace(hosts[r], by_host.size());
    if (fresh) by_host.emplace_back();
    by_host[it->second].push_back(static_cast<int>(r));
  }
  MeshPlace p;
  p.shape = shape;
  p.dp.assign(n, 0);
  p.tp.assign(n, 0);
  p.tp_groups.assign(static_cast<std::size_t>(shape.dp), {});
  p.dp_groups.assign(static_cast<std::size_t>(shape.tp), {});
  const auto t = static_cast<std::size_t>(shape.tp);
  std::size_t k = 0;
  for (const auto& ranks : by_host) {
    for (const int r : ranks) {
      const auto row = k / t;
      const auto col = k % t;
      p.dp[static_cast<std::size_t>(r)] = static_cast<int>(row);
      p.tp[static_cast<std::size_t>(r)] = static_cast<int>(col);
      p.tp_groups[row].push_back(r);  // k grows, so each row fills in tp order
      p.dp_groups[col].push_back(r);  // and each column in dp order
      ++k;
    }
  }
  for (const auto& g : p.tp_groups) {
    for (const int r : g) {
      if (hosts[static_cast<std::size_t>(r)] != hosts[static_cast<std::size_t>(g.front())]) {
        p.tp_crosses_nodes = true;
      }
    }
  }
  return p;
}

std::string MeshPlace::describe(const std::vector<std::string>& hosts) const {
  const auto host_of = [&](int r) {
    return r >= 0 && static_cast<std::size_t>(r) < hosts.size() ? hosts[static_cast<std::size_t>(r)]
                                                                : std::string("?");
  };
  std::string s =
      "mesh dp=" + std::to_string(shape.dp) + " x tp=" + std::to_string(shape.tp) + ": tp groups ";
  // One line for the log: past kShown groups the rest are counted, not listed.
  constexpr std::size_t kShown = 16;
  for (std::size_t i = 0; i < tp_groups.size() && i < kShown; ++i) {
    const auto& g = tp_groups[i];
    if (i > 0) s += ", ";
    std::vector<std::string> seen;
    for (const int r : g) {
      const std::string h = host_of(r);
      if (std::find(seen.begin(), seen.end(), h) == seen.end()) seen.push_back(h);
    }
    s += group_text(g);
    if (seen.size() <= 1) {
      s += " on " + (seen.empty() ? std::string("?") : seen.front());
    } else {
      s += " spans ";
      for (std::size_t k = 0; k < seen.size(); ++k) s += (k > 0 ? "," : "") + seen[k];
    }
  }
  if (tp_groups.size() > kShown) {
    s += ", ... (" + std::to_string(tp_groups.size() - kShown) + " more)";
  }
  return s;
}

namespace {

// The host-name record every rank contributes to the all-gather: a status byte, then the name,
// NUL-padded. A name that does not fit is reported by every rank, never truncated.
constexpr std::size_t kHostRecord = 256;
enum HostStatus : char { kHostOk = 1, kHostTooLong = 2, kHostFailed = 3 };

std::array<char, kHostRecord> my_host_record(std::string* problem) {
  std::array<char, kHostRecord> rec{};
  std::array<char, kHostRecord + 1> name{};  // one more: a name that fills the record is seen
  if (::gethostname(name.data(), name.size()) != 0) {
    const int err = errno;
    rec[0] = err == ENAMETOOLONG ? kHostTooLong : kHostFailed;
    *problem = std::string("gethostname: ") + std::strerror(err);
    return rec;
  }
  const std::size_t len = ::strnlen(name.data(), name.size());
  if (len == 0) {
    rec[0] = kHostFailed;
    *problem = "gethostname gave an empty name";
  } else if (len > kHostRecord - 1) {
    rec[0] = kHostTooLong;
    *problem = "the host name is longer than " + std::to_string(kHostRecord - 1) + " bytes";
  } else {
    rec[0] = kHostOk;
    std::memcpy(rec.data() + 1, name.data(), len);
  }
  return rec;
}

std::vector<std::string> gather_hosts(worker::Communicator* world) {
  std::string problem;
  const auto mine = my_host_record(&problem);
  const int n = world == nullptr ? 1 : world->size();
  std::vector<char> all(static_cast<std::size_t>(n) * kHostRecord);
  if (world == nullptr) {
    std::copy(mine.begin(), mine.end(), all.begin());
  } else {
    world->all_gather(mine.data(), all.data(), kHostRecord);
  }
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    const char* rec = all.data() + static_cast<std::size_t>(r) * kHostRecord;
    if (rec[0] != kHostOk) {
      const int me = world == nullptr ? 0 : world->rank();
      std::string why = rec[0] == kHostTooLong
                            ? "a name longer than " + std::to_string(kHostRecord - 1) + " bytes"
                            : std::string("gethostname failed");
      if (r == me && !problem.empty()) why = problem;
      throw ConfigError("--mesh: rank " + std::to_string(r) + " could not name its host (" + why +
                        ")");
    }
    hosts.emplace_back(rec + 1, ::strnlen(rec + 1, kHostRecord - 1));
  }
  return hosts;
}

// One group's communicator: this rank is at `position` in `members`.
std::unique_ptr<worker::Communicator> connect_group(
    const std::vector<int>& members, int position, const std::string& suffix,
    const std::vector<std::string>& hosts, const std::string& my_host,
    const worker::CommOptions& base, MeshBackend backend, bool shm, int cuda_device) {
  if (members.size() <= 1) return nullptr;
  worker::CommOptions co = base;
  co.rank = position;
  co.size = static_cast<int>(members.size());
  co.key_prefix = base.key_prefix + suffix;
  if (backend == MeshBackend::nccl) return worker::make_nccl_communicator(co, cuda_device);
  auto comm = worker::make_gloo_communicator(co);
  const bool one_host = std::all_of(members.begin(), members.end(), [&](int r) {
    return hosts[static_cast<std::size_t>(r)] == my_host;
  });
  if (shm && one_host) comm = worker::make_local_communicator(std::move(comm), co);
  return comm;
}

}  // namespace

MeshComms make_mesh_comms(worker::Communicator* world, const worker::CommOptions& base,
                          MeshShape shape, MeshBackend backend, bool shm, int cuda_device) {
  const int n = world == nullptr ? 1 : world->size();
  const int me = world == nullptr ? 0 : world->rank();
  // Every rank checks the shape before the first collective, so all fail alike.
  if (shape.dp < 1 || shape.tp < 1 || static_cast<long>(shape.dp) * shape.tp != n) {
    throw ConfigError("--mesh dp=" + std::to_string(shape.dp) + ",tp=" + std::to_string(shape.tp) +
                      ": dp x tp must equal the world's " + std::to_string(n) + " ranks");
  }
  MeshComms m;
  m.hosts = gather_hosts(world);
  m.place = place_mesh(m.hosts, shape);
  const auto my = static_cast<std::size_t>(me);
  const int row = m.place.dp[my];
  const int col = m.place.tp[my];
  m.tp_rank = col;
  m.dp_rank = row;
  const std::string& my_host = m.hosts[my];
  // The same order on every rank, tp then dp: a group's setup involves only its members, so
  // different groups connect concurrently and no rank waits on one that waits on it.
  m.tp =
      connect_group(m.place.tp_groups[static_cast<std::size_t>(row)], col,
                    "/tp" + std::to_string(row), m.hosts, my_host, base, backend, shm, cuda_device);
  m.dp =
      connect_group(m.place.dp_groups[static_cast<std::size_t>(col)], row,
                    "/dp" + std::to_string(col), m.hosts, my_host, base, backend, shm, cuda_device);
  return m;
}

// ---- CountingCommunicator ----

CountingCommunicator::CountingCommunicator(std::unique_ptr<worker::Communicator> inner)
    : inner_(std::move(inner)) {
  if (!inner_) throw ConfigError("CountingCommunicator: no communicator to count");
}

int CountingCommunicator::rank() const { return inner_->rank(); }
int CountingCommunicator::size() const { return inner_->size(); }
const char* CountingCommunicator::backend() const { return inner_->backend(); }

namespace {
std::size_t float_bytes(const std::vector<std::size_t>& counts) {
  return std::accumulate(counts.begin(), counts.end(), std::size_t{0}) * sizeof(float);
}
}  // namespace

void CountingCommunicator::all_reduce_sum(float* data, std::size_t count) {
  inner_->all_reduce_sum(data, count);
  counts_.all_reduce_bytes += count * sizeof(float);
  ++counts_.calls;
}

void CountingCommunicator::broadcast(void* data, std::size_t bytes, int root) {
  inner_->broadcast(data, bytes, root);
  counts_.other_bytes += bytes;
  ++counts_.calls;
}

void CountingCommunicator::barrier() {
  inner_->barrier();
  ++counts_.calls;
}

void CountingCommunicator::all_gather(const void* in, void* out, std::size_t bytes) {
  inner_->all_gather(in, out, bytes);
  counts_.all_gather_bytes += static_cast<std::size_t>(inner_->size()) * bytes;
  ++counts_.calls;
}

void CountingCommunicator::reduce_scatter_sum(const float* in, float* out,
                                              const std::vector<std::size_t>& counts) {
  inner_->reduce_scatter_sum(in, out, counts);
  counts_.reduce_scatter_bytes += float_bytes(counts);
  ++counts_.calls;
}

void CountingCommunicator::all_gather_v(const float* in, float* out,
                                        const std::vector<std::size_t>& counts) {
  inner_->all_gather_v(in, out, counts);
  counts_.all_gather_bytes += float_bytes(counts);
  ++counts_.calls;
}

}  // namespace ddp::train
