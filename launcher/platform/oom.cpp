// Reading the kernel's OOM-kill counters for a worker (see oom.hpp): /proc/<pid>/cgroup and
// /proc/self/mountinfo locate its cgroup's memory.events (v2) or memory.oom_control (v1);
// /proc/vmstat is the host-wide fallback.
#include "ddp/launch/oom.hpp"

#include <signal.h>

#include <charconv>
#include <fstream>
#include <sstream>
#include <vector>

namespace ddp::launch {
namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  while (true) {
    const auto at = s.find(sep, start);
    out.push_back(
        s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      int v = 0;
      bool octal = true;
      for (std::size_t k = 1; k <= 3; ++k) {
        const char c = s[i + k];
        octal = octal && c >= '0' && c <= '7';
        v = v * 8 + (c - '0');
      }
      if (octal) {
        out.push_back(static_cast<char>(v));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

bool has_item(std::string_view list, std::string_view item) {
  for (auto x : split(list, ',')) {
    if (x == item) return true;
  }
  return false;
}

// `path` (a cgroup path) below a mount that shows the hierarchy from `root`.
std::string below_mount(const std::string& mount, const std::string& root,
                        const std::string& path) {
  if (mount.empty() || path.empty() || path[0] != '/') return "";
  std::string rel;
  if (root == "/") {
    rel = path;
  } else if (path.compare(0, root.size(), root) == 0 &&
             (path.size() == root.size() || path[root.size()] == '/')) {
    rel = path.substr(root.size());
  } else {
    return "";  // outside what this mount shows
  }
  if (rel == "/") rel.clear();
  return mount + rel;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  if (!in) return "";
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<std::uint64_t> read_count(const std::string& path) {
  if (path.empty()) return std::nullopt;
  return keyed_value(slurp(path), "oom_kill");
}

const CgroupMounts& mounts() {
  static const CgroupMounts m = parse_mountinfo(slurp("/proc/self/mountinfo"));
  return m;
}

}  // namespace

std::optional<std::uint64_t> keyed_value(std::string_view text, std::string_view key) {
  for (auto line : split(text, '\n')) {
    if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0 ||
        line[key.size()] != ' ') {
      continue;
    }
    auto value = line.substr(key.size() + 1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\r')) value.remove_suffix(1);
    std::uint64_t v = 0;
    auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
      return std::nullopt;
    }
    return v;
  }
  return std::nullopt;
}

ProcCgroups parse_proc_cgroup(std::string_view text) {
  ProcCgroups out;
  for (auto line : split(text, '\n')) {
    const auto first = line.find(':');
    if (first == std::string_view::npos) continue;
    const auto second = line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const auto id = line.substr(0, first);
    const auto controllers = line.substr(first + 1, second - first - 1);
    const std::string path(line.substr(second + 1));
    if (id == "0" && controllers.empty()) {
      out.unified = path;
    } else if (has_item(controllers, "memory")) {
      out.memory_v1 = path;
    }
  }
  return out;
}

CgroupMounts parse_mountinfo(std::string_view text) {
  CgroupMounts out;
  for (auto line : split(text, '\n')) {
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    const auto dash = line.find(" - ");
    if (dash == std::string_view::npos) continue;
    const auto head = split(line.substr(0, dash), ' ');
    const auto tail = split(line.substr(dash + 3), ' ');
    if (head.size() < 5 || tail.size() < 3) continue;
    const std::string root = unescape(head[3]);
    const std::string mount = unescape(head[4]);
    if (tail[0] == "cgroup2") {
      // Several mounts of one hierarchy: the one that shows all of it wins.
      if (out.unified_mount.empty() || (root == "/" && out.unified_root != "/")) {
        out.unified_mount = mount;
        out.unified_root = root;
      }
    } else if (tail[0] == "cgroup" && has_item(tail[2], "memory")) {
      if (out.memory_mount.empty() || (root == "/" && out.memory_root != "/")) {
        out.memory_mount = mount;
        out.memory_root = root;
      }
    }
  }
  return out;
}

CounterFile v2_counter_file(const ProcCgroups& cg, const CgroupMounts& m) {
  const auto dir = below_mount(m.unified_mount, m.unified_root, cg.unified);
  return {dir.empty() ? "" : dir + "/memory.events", cg.unified};
}

CounterFile v1_counter_file(const ProcCgroups& cg, const CgroupMounts& m) {
  const auto dir = below_mount(m.memory_mount, m.memory_root, cg.memory_v1);
  return {dir.empty() ? "" : dir + "/memory.oom_control", cg.memory_v1};
}

std::string OomFinding::headline() const {
  switch (kind) {
    case Kind::killed: return "killed by the kernel's OOM killer (out of memory)";
    case Kind::possibly: return "possibly out of memory";
    case Kind::no: break;
  }
  return "";
}

std::string OomFinding::text() const {
  if (kind == Kind::no) return "";
  return detail.empty() ? headline() : headline() + ": " + detail;
}

OomFinding judge_oom(int signal, const OomWatch& watch, std::optional<std::uint64_t> cgroup_now,
                     std::optional<std::uint64_t> host_now) {
  OomFinding f;
  if (signal != SIGKILL) return f;
  if (watch.at_spawn && cgroup_now) {
    if (*cgroup_now > *watch.at_spawn) {
      f.kind = OomFinding::Kind::killed;
      f.detail = "oom_kill in " + watch.cgroup.path + " went from " +
                 std::to_string(*watch.at_spawn) + " to " + std::to_string(*cgroup_now) +
                 " while it ran";
    }
    return f;  // the cgroup counts every OOM kill of its processes: none means not OOM
  }
  if (watch.host_at_spawn && host_now) {
    if (*host_now > *watch.host_at_spawn) {
      f.kind = OomFinding::Kind::possibly;
      f.detail = "the kernel's OOM killer killed " +
                 std::to_string(*host_now - *watch.host_at_spawn) +
                 " process(es) on this host while it ran (/proc/vmstat oom_kill); its cgroup's "
                 "count is not readable";
    }
    return f;
  }
  f.kind = OomFinding::Kind::possibly;
  f.detail = "no OOM-kill count (cgroup memory.events, /proc/vmstat) is readable here";
  return f;
}

OomWatch watch_oom(pid_t pid) {
  OomWatch w;
  const auto cg = parse_proc_cgroup(slurp("/proc/" + std::to_string(pid) + "/cgroup"));
  for (const auto& file : {v2_counter_file(cg, mounts()), v1_counter_file(cg, mounts())}) {
    if (auto n = read_count(file.path)) {
      w.cgroup = file;
      w.at_spawn = n;
      break;
    }
  }
  w.host_at_spawn = read_count("/proc/vmstat");
  return w;
}

OomFinding check_oom(const OomWatch& watch, int signal) {
  if (signal != SIGKILL) return {};
  return judge_oom(signal, watch, read_count(watch.cgroup.path), read_count("/proc/vmstat"));
}

}  // namespace ddp::launch
