// Worker output routing and the prefixing pump (see worker_output.hpp).
#include "ddp/launch/worker_output.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string_view>

#include "ddp/launch/macros.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/proto/knobs.hpp"

namespace ddp::launch {
namespace fs = std::filesystem;
namespace {

// Returns 0, or the errno of the write that failed (a closed console loses output, never the
// job; a full disk is reported by the caller).
int write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return errno;
    if (w == 0) return EIO;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

std::string random_suffix() {
  static const char* chars = "abcdefghijklmnopqrstuvwxyz0123456789_";
  std::random_device rd;
  std::mt19937 rng(rd());
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(chars[rng() % 37]);
  return s;
}

// Logs can hold secrets: the run's folders are private (0700), as torchrun's mkdtemp'd one.
void make_private_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!ec) fs::permissions(dir, fs::perms::owner_all, fs::perm_options::replace, ec);
  if (ec) throw IoError("cannot create the log directory " + dir + ": " + ec.message());
}

int open_log(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0644);
  if (fd < 0) throw IoError("cannot create the log file " + path + ": " + std::strerror(errno));
  return fd;
}

}  // namespace

std::string line_cut_marker(std::size_t bytes) {
  return "\xe2\x80\xa6[ddprun: line cut at " + std::to_string(bytes) + " bytes]";
}

std::string expand_prefix(const std::string& tmpl, const PrefixVars& v) {
  return safe_substitute(tmpl, {{"role_name", v.role_name},
                                {"local_rank", std::to_string(v.local_rank)},
                                {"rank", std::to_string(v.rank)},
                                {"group_rank", std::to_string(v.group_rank)},
                                {"hostname", v.host},
                                {"host", v.host}});
}

RunLogDir::RunLogDir(const std::string& log_dir, const std::string& run_id) {
  if (log_dir == "/dev/null") return;
  std::string base = log_dir;
  if (base.empty()) {
    const auto tmp_dir = knobs::text("TMPDIR");
    const char* tmp = tmp_dir ? tmp_dir->c_str() : nullptr;
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/torchelastic_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      throw IoError("cannot create a temporary log directory " + tmpl + ": " +
                    std::strerror(errno));
    }
    base = tmpl;
    temp_base_ = tmpl;
    temporary_ = true;
  }
  root_ = base + "/" + run_id + "_" + random_suffix();
  make_private_dir(root_);
}

std::string RunLogDir::make_attempt(int attempt) const {
  if (!enabled()) return "";
  std::string dir = root_ + "/attempt_" + std::to_string(attempt);
  make_private_dir(dir);
  return dir;
}

std::string RunLogDir::make_rank_dir(const std::string& attempt_dir, int local_rank) {
  if (attempt_dir.empty()) return "";
  std::string dir = attempt_dir + "/" + std::to_string(local_rank);
  make_private_dir(dir);
  return dir;
}

void RunLogDir::remove_if_temporary() const {
  if (!temporary_ || keep_) return;
  std::error_code ec;
  fs::remove_all(temp_base_, ec);
}

OutputPump::OutputPump(int console_out, int console_err, std::size_t max_line_bytes)
    : console_out_(console_out), console_err_(console_err), max_line_(max_line_bytes) {}

OutputPump::~OutputPump() {
  after_start();
  for (auto& [fd, s] : streams_) close_stream(s);
  for (auto& d : dup_) {
    if (d.fd >= 0) ::close(d.fd);
  }
}

void OutputPump::duplicate(bool is_err, const std::vector<std::string>& filters,
                           const std::string& path) {
  Duplicate& d = dup_[is_err ? 1 : 0];
  if (filters.empty() || d.fd >= 0) return;
  d.fd = open_log(path);
  d.filters = filters;
  d.path = path;
}

bool OutputPump::matches(const Duplicate& d, const char* line, std::size_t n) const {
  if (d.fd < 0) return false;
  const std::string_view text(line, n);
  return std::any_of(d.filters.begin(), d.filters.end(),
                     [&](const std::string& f) { return text.find(f) != std::string_view::npos; });
}

int OutputPump::route(int local_rank, bool is_err, const std::string& prefix, bool to_file,
                      bool tee, bool on_console, const std::string& path) {
  (void)local_rank;
  const bool console = on_console && (!to_file || tee);
  const int console_fd = is_err ? console_err_ : console_out_;
  const bool duplicated = console && dup_[is_err ? 1 : 0].fd >= 0;
  if (!to_file && console && prefix.empty() && !duplicated) return -1;  // inherit: nothing to add
  if (!console && !to_file) {
    int null_fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null_fd < 0) throw IoError(std::string("cannot open /dev/null: ") + std::strerror(errno));
    child_ends_.push_back(null_fd);
    return null_fd;
  }
  // A file is written by the pump, never by the worker: a full disk then costs the file, not
  // the worker's next print.
  int file_fd = to_file ? open_log(path) : -1;
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    if (file_fd >= 0) ::close(file_fd);
    throw IoError(std::string("pipe2 failed: ") + std::strerror(errno));
  }
  ::fcntl(p[0], F_SETFL, ::fcntl(p[0], F_GETFL) | O_NONBLOCK);
  Stream s;
  s.read_fd = p[0];
  s.console_fd = console ? console_fd : -1;
  s.file_fd = file_fd;
  s.file_path = path;
  s.prefix = prefix;
  s.is_err = is_err;
  streams_[p[0]] = std::move(s);
  child_ends_.push_back(p[1]);
  return p[1];
}

void OutputPump::attach(WorkerSpec& spec, int local_rank, const std::string& prefix, Std redirect,
                        Std tee, bool on_console, const std::string& rank_dir) {
  auto has = [](Std s, Std bit) {
    return (static_cast<unsigned>(s) & static_cast<unsigned>(bit)) != 0;
  };
  const bool files = !rank_dir.empty();
  for (bool is_err : {false, true}) {
    Std bit = is_err ? Std::err : Std::out;
    bool t = has(tee, bit);
    bool to_file = files && (has(redirect, bit) || t);
    int fd = route(local_rank, is_err, prefix, to_file, t, on_console,
                   rank_dir + (is_err ? "/stderr.log" : "/stdout.log"));
    (is_err ? spec.stderr_fd : spec.stdout_fd) = fd;
  }
}

void OutputPump::after_start() {
  for (int fd : child_ends_) ::close(fd);
  child_ends_.clear();
}

std::vector<int> OutputPump::fds() const {
  std::vector<int> out;
  for (const auto& [fd, s] : streams_) out.push_back(fd);
  return out;
}

bool OutputPump::pump(Stream& s) {
  char buf[65536];
  while (true) {
    ssize_t n = ::read(s.read_fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    if (n == 0) return false;
    const auto len = static_cast<std::size_t>(n);
    write_file(s, buf, len);
    if (s.console_fd >= 0) {
      s.pending.append(buf, len);
      emit(s, /*all=*/false);
    }
    if (len < sizeof(buf)) return true;
  }
}

// A log file that fails (ENOSPC, EIO, EFBIG under RLIMIT_FSIZE) is named once on the agent's
// stderr and closed: the rest of the stream goes to the console only (when it goes there).
void OutputPump::write_file(Stream& s, const char* p, std::size_t n) {
  if (s.file_fd < 0) return;
  int err = write_all(s.file_fd, p, n);
  if (err == 0) return;
  std::string msg = "ddprun: cannot write the log file " + s.file_path + ": " + std::strerror(err) +
                    "; the rest of this stream is not written to it" +
                    (s.console_fd >= 0 ? " (the console still gets it)\n" : "\n");
  write_all(console_err_, msg.data(), msg.size());
  ::close(s.file_fd);
  s.file_fd = -1;
}

// Writes the pending console text's whole lines (ending in '\n', or '\r' so progress bars
// keep moving), each with the prefix, in one write per batch; an unfinished line waits for its
// end, up to max_line_ bytes, where it is cut with a marker. `all` (at EOF) also writes an
// unfinished line's text.
void OutputPump::emit(Stream& s, bool all) {
  const std::string& p = s.pending;
  std::string out;
  Duplicate& dup = dup_[s.is_err ? 1 : 0];
  std::string dup_out;
  // The line just appended to `out` (from `start`) also goes to the filtered file if it matches.
  auto also_filtered = [&](std::size_t start) {
    const char* line = out.data() + start + s.prefix.size();
    if (matches(dup, line, out.size() - start - s.prefix.size())) dup_out.append(out, start);
  };
  std::size_t pos = 0;           // the start of the current line in pending
  std::size_t from = s.scanned;  // where to look for its end
  while (pos < p.size()) {
    const auto end = p.find_first_of("\n\r", from);
    const std::size_t start = out.size();
    if ((end == std::string::npos ? p.size() : end) - pos > max_line_) {
      out += s.prefix;
      out.append(p, pos, max_line_);
      out += line_cut_marker(max_line_);
      out.push_back('\n');
      also_filtered(start);
      pos = from = pos + max_line_;
      continue;
    }
    if (end == std::string::npos) {
      if (all) {
        out += s.prefix;
        out.append(p, pos, std::string::npos);
        also_filtered(start);
        pos = p.size();
        s.at_line_start = false;
      }
      break;
    }
    out += s.prefix;
    out.append(p, pos, end + 1 - pos);
    also_filtered(start);
    pos = from = end + 1;
    s.at_line_start = true;
  }
  s.pending.erase(0, pos);
  s.scanned = s.pending.size();
  if (!out.empty()) write_all(s.console_fd, out.data(), out.size());
  if (!dup_out.empty() && write_all(dup.fd, dup_out.data(), dup_out.size()) != 0) {
    const std::string msg = "ddprun: cannot write " + dup.path + "; no more lines go to it\n";
    write_all(console_err_, msg.data(), msg.size());
    ::close(dup.fd);
    dup.fd = -1;
  }
}

void OutputPump::close_stream(Stream& s) {
  if (s.read_fd >= 0) ::close(s.read_fd);
  if (s.file_fd >= 0) ::close(s.file_fd);
  if (s.console_fd >= 0) emit(s, /*all=*/true);
  // A worker that died mid-line: end the line so the next output starts clean.
  if (!s.at_line_start && s.console_fd >= 0) write_all(s.console_fd, "\n", 1);
  s.at_line_start = true;
  s.read_fd = s.file_fd = -1;
}

void OutputPump::on_readable(int fd) {
  auto it = streams_.find(fd);
  if (it == streams_.end()) return;
  if (!pump(it->second)) {
    close_stream(it->second);
    streams_.erase(it);
  }
}

void OutputPump::drain() {
  for (auto& [fd, s] : streams_) {
    pump(s);
    close_stream(s);
  }
  streams_.clear();
}

}  // namespace ddp::launch
