// DCGM's job mapping files (gpu_job_mapping.hpp): a line per job, edited under the file's flock
// and replaced whole.
#include "ddp/launch/gpu_job_mapping.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "ddp/proto/error.hpp"

namespace ddp::launch {
namespace {

constexpr std::size_t kMaxJobId = 256;
constexpr std::size_t kMaxFileBytes = 1 << 20;  // a mapping file is a few lines

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += l + "\n";
  return out;
}

std::string read_small(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n = 0;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 && out.size() < kMaxFileBytes) {
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

// Rewrites `path` as edit(its text) while holding its flock; removes it when left empty.
template <typename Edit>
void rewrite(const std::string& path, Edit edit) {
  int fd = -1;
  for (int tries = 0;; ++tries) {  // the file locked is still the one the path names
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw IoError(path + ": " + std::strerror(errno));
    ::flock(fd, LOCK_EX);
    struct stat held {
    }, named{};
    if (::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 &&
        held.st_ino == named.st_ino && held.st_dev == named.st_dev) {
      break;
    }
    ::close(fd);  // replaced or removed by another job meanwhile: open it again
    if (tries == 100) throw IoError(path + ": keeps changing under the lock");
  }
  const std::string text = edit(read_small(fd));
  if (text.empty()) {
    ::unlink(path.c_str());
  } else {
    const std::string tmp = path + ".ddprun-" + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << text;
      if (!out.flush()) {
        ::close(fd);
        ::unlink(tmp.c_str());
        throw IoError(tmp + ": cannot write");
      }
    }
    ::chmod(tmp.c_str(), 0644);
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw IoError(path + ": " + why);
    }
  }
  ::close(fd);  // the lock goes with it
}

}  // namespace

std::string with_job(const std::string& text, const std::string& job) {
  auto lines = lines_of(text);
  if (std::find(lines.begin(), lines.end(), job) == lines.end()) lines.push_back(job);
  return joined(lines);
}

std::string without_job(const std::string& text, const std::string& job) {
  auto lines = lines_of(text);
  std::erase(lines, job);
  return joined(lines);
}

GpuJobMapping::GpuJobMapping(std::string dir, std::string job, const std::vector<int>& gpus)
    : dir_(std::move(dir)), job_(std::move(job)) {
  const std::string flag = "--gpu-job-mapping-dir " + dir_;
  if (job_.empty() || job_.size() > kMaxJobId || job_.find('\n') != std::string::npos) {
    throw ConfigError(flag + ": the job id must be one line of 1 to 256 bytes");
  }
  struct stat st {};
  if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw ConfigError(flag + ": not a folder");
  }
  std::set<int> seen;
  for (int g : gpus) {
    if (g < 0 || !seen.insert(g).second) continue;
    const std::string path = dir_ + "/" + std::to_string(g);
    try {
      rewrite(path, [&](const std::string& t) { return with_job(t, job_); });
    } catch (const Error& e) {
      throw ConfigError(flag + ": " + e.what());
    }
    files_.push_back(path);
  }
}

GpuJobMapping::~GpuJobMapping() {
  for (const auto& path : files_) {
    try {
      rewrite(path, [&](const std::string& t) { return without_job(t, job_); });
    } catch (const Error& e) {
      std::fprintf(stderr, "ddprun: --gpu-job-mapping-dir: %s\n", e.what());
    }
  }
}

}  // namespace ddp::launch
