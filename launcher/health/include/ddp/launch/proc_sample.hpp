// What /proc says about a worker without its help: scheduler state, CPU time (utime + stime),
// resident memory, and the kernel wait point of its main thread (wchan). Tells "computing" (R, CPU
// rising) from "blocked" (S, no CPU: a futex in a collective, a sleep); only stacks tell which.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ddp::launch {

struct ProcSample {
  char state = '?';             // R, S, D, Z, T, ...
  std::uint64_t cpu_ticks = 0;  // utime + stime, in clock ticks (all threads)
  std::string wchan;            // "" when unreadable or running
  std::uint64_t rss_bytes = 0;  // resident set size (field 24 rss, pages * page size); 0 if absent
};

// /proc/<pid>/stat's text (the comm field may hold spaces and parentheses). nullopt if garbled.
// A line cut before rss (field 24) still parses, with rss_bytes 0.
std::optional<ProcSample> parse_proc_stat(std::string_view text);

// Reads /proc/<pid>/stat and /proc/<pid>/wchan; nullopt when the process is gone.
std::optional<ProcSample> sample_process(pid_t pid);

long clock_ticks_per_second();
std::uint64_t page_size_bytes();  // sysconf(_SC_PAGESIZE), what rss pages are counted in

}  // namespace ddp::launch
