// Naming a worker killed by the kernel's OOM killer. The kernel counts OOM kills per memory
// cgroup, whatever kind of OOM (the cgroup's limit or the whole machine): cgroup v2's
// memory.events `oom_kill`, cgroup v1's memory.oom_control `oom_kill`. WorkerGroup reads the
// counter of the worker's cgroup when it starts the worker and again when the worker died of
// SIGKILL: a higher count means the OOM killer killed it. Where no cgroup counter is readable,
// the host's /proc/vmstat `oom_kill` tells whether any OOM kill happened meanwhile ("possibly
// out of memory"); where nothing is readable, a SIGKILL is "possibly out of memory" too, since
// nothing rules it out. The parsers and the verdict are pure; watch_oom/check_oom read files.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::launch {

// The value of `key` in a flat keyed file ("oom_kill 3" lines: memory.events,
// memory.oom_control, /proc/vmstat); nullopt when absent or not a number.
std::optional<std::uint64_t> keyed_value(std::string_view text, std::string_view key);

// A process's cgroups, from /proc/<pid>/cgroup: the cgroup v2 path ("0::/a/b") and the v1
// memory controller's ("4:memory:/a/b", also "4:cpu,memory:/a/b"). Empty when absent.
struct ProcCgroups {
  std::string unified;
  std::string memory_v1;
};
ProcCgroups parse_proc_cgroup(std::string_view text);

// Where the hierarchies are mounted, from /proc/self/mountinfo: the mount point and the root
// of the hierarchy it shows (a container may see a subtree only). Empty when not mounted.
struct CgroupMounts {
  std::string unified_mount, unified_root;
  std::string memory_mount, memory_root;
};
CgroupMounts parse_mountinfo(std::string_view text);

// The file that counts OOM kills for a process with these cgroups: v2 first, then v1.
struct CounterFile {
  std::string path;    // "" when the cgroup is outside every visible mount
  std::string cgroup;  // the cgroup's path, for messages
};
CounterFile v2_counter_file(const ProcCgroups& cg, const CgroupMounts& m);
CounterFile v1_counter_file(const ProcCgroups& cg, const CgroupMounts& m);

// What the counters say about one worker's death.
struct OomFinding {
  enum class Kind : unsigned char { no, killed, possibly };
  Kind kind = Kind::no;
  std::string detail;  // for the summary: what was read, where
  bool named() const { return kind != Kind::no; }
  // "killed by the kernel's OOM killer (out of memory)" / "possibly out of memory"; "" for no.
  std::string headline() const;
  // The headline and the detail: "killed by the kernel's OOM killer (out of memory): ...".
  std::string text() const;
};

// The counters of one worker: its cgroup's at spawn, and the host's as a fallback.
struct OomWatch {
  CounterFile cgroup;                          // path empty: no cgroup counter readable at spawn
  std::optional<std::uint64_t> at_spawn;       // the cgroup's count when the worker started
  std::optional<std::uint64_t> host_at_spawn;  // /proc/vmstat oom_kill then
};

// The verdict from the counts (pure). Only a SIGKILL can be the OOM killer's.
OomFinding judge_oom(int signal, const OomWatch& watch, std::optional<std::uint64_t> cgroup_now,
                     std::optional<std::uint64_t> host_now);

// Reads the worker's cgroup (/proc/<pid>/cgroup) and its counter, and the host's counter.
OomWatch watch_oom(pid_t pid);
// Reads the counters again after the worker died of `signal`; judge_oom on what it read.
OomFinding check_oom(const OomWatch& watch, int signal);

}  // namespace ddp::launch
