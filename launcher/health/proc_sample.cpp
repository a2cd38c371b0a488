// See proc_sample.hpp. /proc/<pid>/stat is "pid (comm) state ppid ... utime stime ...": comm
// is the process name, up to 15 bytes of anything (spaces, ")", "(" included), so the fields
// are counted from the last ')'. Each file is read with one open and one read.
#include "ddp/launch/proc_sample.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <string>

namespace ddp::launch {
namespace {

// Fields after the comm: [0] state (field 3 of proc(5)), ..., [11] utime (14), [12] stime (15),
// ..., [21] rss (24, in pages).
constexpr std::size_t kUtime = 11, kStime = 12, kRss = 21;

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// The whole (small) file, or nullopt when it cannot be opened or read.
std::optional<std::string> read_small(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::string out;
  char buf[1024];
  ssize_t n = 0;
  while (out.size() < 8192) {
    n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  if (n < 0) return std::nullopt;
  return out;
}

}  // namespace

std::optional<ProcSample> parse_proc_stat(std::string_view text) {
  const auto open = text.find('(');
  const auto close = text.rfind(')');
  if (open == std::string_view::npos || close == std::string_view::npos || close < open) {
    return std::nullopt;
  }
  if (open < 2 || text[open - 1] != ' ' || !parse_u64(text.substr(0, open - 1))) {
    return std::nullopt;  // "<pid> (" first
  }
  std::string_view rest = text.substr(close + 1);
  std::string_view fields[kRss + 1];
  std::size_t count = 0;
  while (count <= kRss) {
    const auto begin = rest.find_first_not_of(" \n");
    if (begin == std::string_view::npos) break;
    rest.remove_prefix(begin);
    const auto end = rest.find_first_of(" \n");
    fields[count++] = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
  }
  if (count <= kStime || fields[0].size() != 1) return std::nullopt;
  const auto utime = parse_u64(fields[kUtime]), stime = parse_u64(fields[kStime]);
  if (!utime || !stime) return std::nullopt;
  ProcSample s;
  s.state = fields[0][0];
  s.cpu_ticks = *utime + *stime;
  if (count > kRss) {
    const auto pages = parse_u64(fields[kRss]);
    const std::uint64_t page = page_size_bytes();
    if (!pages || *pages > UINT64_MAX / page) return std::nullopt;
    s.rss_bytes = *pages * page;
  }
  return s;
}

std::optional<ProcSample> sample_process(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid);
  const auto stat = read_small(dir + "/stat");
  if (!stat) return std::nullopt;  // gone (ESRCH/ENOENT)
  auto sample = parse_proc_stat(*stat);
  if (!sample) return std::nullopt;
  if (auto wchan = read_small(dir + "/wchan")) {
    std::string w = *wchan;
    while (!w.empty() && (w.back() == '\n' || w.back() == ' ')) w.pop_back();
    if (w != "0") sample->wchan = std::move(w);  // "0": running, or no wait point
  }
  return sample;
}

long clock_ticks_per_second() {
  static const long ticks = [] {
    const long t = ::sysconf(_SC_CLK_TCK);
    return t > 0 ? t : 100L;
  }();
  return ticks;
}

std::uint64_t page_size_bytes() {
  static const std::uint64_t bytes = [] {
    const long b = ::sysconf(_SC_PAGESIZE);
    return b > 0 ? static_cast<std::uint64_t>(b) : std::uint64_t{4096};
  }();
  return bytes;
}

}  // namespace ddp::launch
