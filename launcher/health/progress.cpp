// See progress.hpp. The line parser is strict about the fields it knows (a step is digits only,
// no sign, within int64) and ignores keys it does not know. The reader drains each pipe with
// a bounded number of non-blocking reads per wake-up, assembles lines across reads (a line
// longer than kMaxProgressLine is dropped and counted), and applies every line that carries the
// worker's clock (t=) in order, so lines read together keep their own times; of lines without
// t= read together only the last is applied: k steps that arrive together count as k steps
// over the time since the previous step change, not as one long step and k-1 empty ones.
#include "ddp/launch/progress.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <charconv>
#include <cmath>
#include <cstring>

#include "ddp/proto/error.hpp"
#include "ddp/proto/metric_name.hpp"

namespace ddp::launch {
namespace {

constexpr std::size_t kMaxPhase = 64;      // a phase is a short word
constexpr std::size_t kReadChunk = 65536;  // one read()
constexpr int kReadsPerWakeup = 16;        // up to kPipeBytes per drain
constexpr int kPipeBytes = 1 << 20;        // asked of F_SETPIPE_SZ: a second of fast steps

bool is_blank(char c) { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) {
  while (!s.empty() && (is_blank(s.front()) || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (is_blank(s.back()) || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A metric's value: a finite number, a sign allowed ("-0.5", "3e-4").
std::optional<double> parse_metric(std::string_view s) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) {
    return std::nullopt;
  }
  return v;
}

// Digits only (no sign, no blanks), within int64.
std::optional<std::int64_t> parse_step(std::string_view s) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<double> parse_time(std::string_view s) {
  if (s.empty() || s.front() == '+' || s.front() == '-') return std::nullopt;
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

bool is_word(std::string_view s) {
  if (s.empty() || s.size() > kMaxPhase) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.' || c == ':' || c == '/';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::optional<ProgressLine> parse_progress_line(std::string_view line) {
  line = trim(line);
  if (line.empty()) return std::nullopt;
  ProgressLine out;
  if (auto bare = parse_step(line)) {  // just "<n>"
    out.step = *bare;
    return out;
  }
  bool have_step = false, have_phase = false;
  while (!line.empty()) {
    const auto end = std::min(line.find(' '), line.find('\t'));
    const std::string_view token = line.substr(0, end);
    line = end == std::string_view::npos ? std::string_view() : trim(line.substr(end));
    const auto eq = token.find('=');
    if (eq == 0 || eq == std::string_view::npos) return std::nullopt;
    const std::string_view key = token.substr(0, eq), value = token.substr(eq + 1);
    if (key == "step") {
      auto v = parse_step(value);
      if (!v || have_step) return std::nullopt;
      out.step = *v;
      have_step = true;
    } else if (key == "phase") {
      if (!is_word(value) || have_phase) return std::nullopt;
      out.phase = std::string(value);
      have_phase = true;
    } else if (key == "t") {
      auto v = parse_time(value);
      if (!v || out.t) return std::nullopt;
      out.t = v;
    } else if (key == "recover") {
      if (value != "in_place" && value != "restart" && value != "elastic") return std::nullopt;
      (value == "restart" ? out.recover_restart : out.recover_in_place) = true;
      out.recover_regroup = value == "elastic";
    } else if (key == "samples" || key == "total") {
      auto v = parse_step(value);
      if (!v) return std::nullopt;
      (key == "samples" ? out.samples : out.total) = *v;
    } else if (auto v = parse_metric(value);
               v && ddp::metric_name_ok(key) && out.metrics.size() < kMaxLineMetrics) {
      out.metrics.emplace_back(std::string(key), *v);
    } else {
      // The line still counts: its step is what the agent lives on. The first bad one is
      // named (cut, printable), the rest counted.
      if (out.bad_metrics++ == 0) {
        std::string shown(token.substr(0, 64));
        for (char& c : shown) {
          if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
        }
        out.bad_metric =
            "'" + shown + (token.size() > 64 ? "...'" : "'") +
            (!ddp::metric_name_ok(key) ? ": not a metric name ([A-Za-z_][A-Za-z0-9_.-]*, "
                                         "at most 48 bytes)"
             : !v                      ? ": not a finite number"
                  : ": more than " + std::to_string(kMaxLineMetrics) + " metrics on one line");
      }
    }
  }
  if (!have_step && !out.recover_in_place && !out.recover_restart) return std::nullopt;
  if (!have_step) out.step = -1;  // a declaration alone
  return out;
}

namespace {

void record(RankProgress& r, double seconds) {
  if (!(seconds >= 0)) return;  // a clock that went back
  r.step_s.push_back(seconds);
  if (r.step_s.size() > kStepHistory) {
    r.step_s.erase(r.step_s.begin(),
                   r.step_s.begin() + static_cast<std::ptrdiff_t>(r.step_s.size() - kStepHistory));
  }
}

// The wall clock of a steady time point (for step spans without the worker's t=).
double unix_of(SteadyTime t) {
  using namespace std::chrono;
  const auto offset =
      system_clock::now().time_since_epoch() - steady_clock::now().time_since_epoch();
  return duration<double>(t.time_since_epoch() + offset).count();
}

void span(RankProgress& r, std::int64_t step, double unix) {
  if (r.unix_at >= 0 && step > r.step && unix >= r.unix_at) {
    r.spans.push_back({r.step, r.unix_at, unix});
    if (r.spans.size() > kTraceSteps) r.spans.pop_front();
  }
  if (r.step < 0 || step != r.step) r.unix_at = unix;
}

}  // namespace

void ProgressReader::apply(RankProgress& r, const ProgressLine& line, SteadyTime now) {
  if (line.recover_in_place || line.recover_restart) {
    r.recovers_in_place = line.recover_in_place;
    r.regroups = line.recover_regroup;
  }
  if (line.step < 0) return;  // a declaration, not a step
  r.bad_metrics += static_cast<std::uint64_t>(line.bad_metrics);
  if (r.bad_metric.empty()) r.bad_metric = line.bad_metric;
  if (!line.metrics.empty()) ++r.metric_lines;
  for (const auto& [key, value] : line.metrics) {
    auto it = r.metrics.find(key);
    if (it == r.metrics.end()) {
      if (r.metrics.size() >= ddp::kMaxRankMetrics) {
        if (r.bad_metrics++ == 0 || r.bad_metric.empty()) {
          r.bad_metric = "'" + key + "': more than " + std::to_string(ddp::kMaxRankMetrics) +
                         " metric names from one worker";
        }
        continue;
      }
      it = r.metrics.emplace(key, RankProgress::Metric{}).first;
    }
    it->second = {value, line.step, r.metric_lines};
  }
  if (r.first_step_unix < 0) r.first_step_unix = line.t ? *line.t : unix_of(now);
  r.reported = true;
  if (line.samples >= 0) r.samples = line.samples;
  if (line.total >= 0) r.total_steps = line.total;
  span(r, line.step, line.t ? *line.t : unix_of(now));
  const double clock =
      line.t ? *line.t : std::chrono::duration<double>(now.time_since_epoch()).count();
  const bool new_step = r.step < 0 || line.step != r.step;
  // A heal (or regroup) ends with the first line of another phase after it.
  if (r.phase == "heal" && line.phase != "heal") r.healed_unix = line.t ? *line.t : unix_of(now);
  // The compute phase ends with any other phase or step: its length is the step's own work.
  if (r.compute_from >= 0 && r.phase == "compute" && (new_step || line.phase != "compute")) {
    record(r, clock - r.compute_from);
    r.compute_from = -1;
  }
  if (line.phase == "compute" && (new_step || r.phase != "compute")) {
    r.phased = true;
    r.compute_from = clock;
  }
  if (r.step < 0 || line.step < r.step) {  // the first step, or a counter that went back
    r.step = line.step;
    r.step_change = now;
    r.last_change = now;
    r.phase = line.phase;
    r.clock_at = clock;
    r.step_at = line.step;
    return;
  }
  if (line.step > r.step) {
    // Without phases: the interval per step. Lines read together without t= have one arrival
    // time; their steps are timed together with the next interval that has a length.
    if (!r.phased && clock > r.clock_at && r.step_at >= 0) {
      record(r, (clock - r.clock_at) / static_cast<double>(line.step - r.step_at));
      r.clock_at = clock;
      r.step_at = line.step;
    }
    r.step = line.step;
    r.step_change = now;
    r.last_change = now;
  }
  if (line.phase != r.phase) {
    r.phase = line.phase;
    r.last_change = now;
  }
}

void ProgressReader::close_pipe(Pipe& p) {
  for (int fd : {p.read_fd, p.write_fd, p.control_read, p.control_write}) {
    if (fd >= 0) ::close(fd);
  }
}

ProgressReader::~ProgressReader() {
  for (auto& [fd, p] : pipes_) close_pipe(p);
}

int ProgressReader::open_rank(int local_rank, SteadyTime now) {
  for (auto it = pipes_.begin(); it != pipes_.end(); ++it) {  // opened again: drop the old one
    if (it->second.local_rank != local_rank) continue;
    close_pipe(it->second);
    pipes_.erase(it);
    break;
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw IoError("progress pipe for local rank " + std::to_string(local_rank) + ": " +
                  std::strerror(errno));
  }
  // The agent drains the pipes at each check, not at each line (a line per step would wake it
  // thousands of times a second, beside the training on the same cores): room for about a
  // second of lines. Best effort: a smaller pipe drops lines, never blocks the worker.
  (void)::fcntl(p[1], F_SETPIPE_SZ, kPipeBytes);
  Pipe pipe;
  pipe.local_rank = local_rank;
  pipe.read_fd = p[0];
  pipe.write_fd = p[1];
  // The other way, agent to worker (tell()): its read end is the worker's (DDPRUN_CONTROL_FD).
  int c[2];
  if (::pipe2(c, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int e = errno;
    ::close(p[0]);
    ::close(p[1]);
    throw IoError("control pipe for local rank " + std::to_string(local_rank) + ": " +
                  std::strerror(e));
  }
  pipe.control_read = c[0];
  pipe.control_write = c[1];
  pipes_[p[0]] = std::move(pipe);
  RankProgress fresh;
  fresh.last_change = now;
  fresh.step_change = now;
  ranks_[local_rank] = std::move(fresh);
  return p[1];
}

void ProgressReader::after_start() {
  for (auto& [fd, p] : pipes_) {
    if (p.write_fd >= 0) ::close(p.write_fd);
    if (p.control_read >= 0) ::close(p.control_read);
    p.write_fd = -1;
    p.control_read = -1;
  }
}

int ProgressReader::control_end(int local_rank) const {
  for (const auto& [fd, p] : pipes_) {
    if (p.local_rank == local_rank) return p.control_read;
  }
  return -1;
}

bool ProgressReader::tell(int local_rank, std::string_view line) {
  for (const auto& [fd, p] : pipes_) {
    if (p.local_rank != local_rank || p.control_write < 0) continue;
    const ssize_t n = ::write(p.control_write, line.data(), line.size());
    return n == static_cast<ssize_t>(line.size());
  }
  return false;
}

std::vector<int> ProgressReader::fds() const {
  std::vector<int> out;
  out.reserve(pipes_.size());
  for (const auto& [fd, p] : pipes_) out.push_back(fd);
  return out;
}

void ProgressReader::note_activity(int local_rank, SteadyTime now) {
  RankProgress& r = ranks_[local_rank];
  r.reported = true;
  r.last_change = now;
}

void ProgressReader::on_readable(int fd, SteadyTime now) {
  auto it = pipes_.find(fd);
  if (it == pipes_.end()) return;
  Pipe& p = it->second;
  RankProgress& rank = ranks_[p.local_rank];
  // Lines with the worker's clock (t=) are applied one by one; of those without, read together
  // and so sharing one arrival time, the last one wins.
  std::optional<ProgressLine> untimed;
  auto take_line = [&](std::string_view text) {
    if (trim(text).empty()) return;  // blank lines are not counted
    if (auto line = parse_progress_line(text)) {
      if (line->recover_in_place || line->recover_restart) {  // never one of the "last wins"
        rank.recovers_in_place = line->recover_in_place;
        rank.regroups = line->recover_regroup;
      }
      if (line->step < 0) return;
      if (line->t) {
        if (untimed) apply(rank, *std::exchange(untimed, std::nullopt), now);
        apply(rank, *line, now);
      } else {
        // Of untimed lines read together the last wins, but no metric is lost: a val_loss= on
        // an earlier one goes on with it (and its bad metrics are counted).
        if (untimed) {
          line->bad_metrics += untimed->bad_metrics;
          if (!untimed->bad_metric.empty()) line->bad_metric = untimed->bad_metric;  // the first
          for (auto& m : untimed->metrics) {
            const bool has = std::any_of(line->metrics.begin(), line->metrics.end(),
                                         [&](const auto& n) { return n.first == m.first; });
            if (!has && line->metrics.size() < kMaxLineMetrics) line->metrics.push_back(m);
          }
        }
        untimed = std::move(line);
      }
    } else {
      ++rank.bad_lines;
    }
  };
  bool eof = false;
  char buf[kReadChunk];
  for (int reads = 0; reads < kReadsPerWakeup; ++reads) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) {  // EOF (every holder of the write end is gone) or an error
      eof = true;
      break;
    }
    std::string_view chunk(buf, static_cast<std::size_t>(n));
    while (!chunk.empty()) {
      const auto nl = chunk.find('\n');
      const std::string_view piece = chunk.substr(0, nl);
      chunk = nl == std::string_view::npos ? std::string_view() : chunk.substr(nl + 1);
      if (!p.overlong) {
        p.pending.append(piece);
        if (p.pending.size() > kMaxProgressLine) {  // dropped and counted once
          ++rank.bad_lines;
          p.pending.clear();
          p.overlong = true;
        }
      }
      if (nl == std::string_view::npos) break;  // the line goes on in a later read
      if (!p.overlong) take_line(p.pending);
      p.pending.clear();
      p.overlong = false;
    }
    if (static_cast<std::size_t>(n) < sizeof(buf)) break;  // drained
  }
  if (eof && !p.overlong) take_line(p.pending);  // a last line without its newline
  if (untimed) apply(rank, *untimed, now);
  if (eof) {
    ::close(p.read_fd);
    if (p.write_fd >= 0) ::close(p.write_fd);
    pipes_.erase(it);
  }
}

}  // namespace ddp::launch
