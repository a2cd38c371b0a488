// A real etcd (Debian's etcd-server 3.4) for a test: 1 or 3 members on 127.0.0.1 with ports the
// OS chose (bound, read, released), their data in a fresh directory under /dev/shm (removed at
// the end), members stopped by PID. Tests skip visibly when /usr/bin/etcd is not installed
// (scripts/setup.sh installs it).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ddp/rdzv/etcd/api.hpp"
#include "ddp/rdzv/etcd/http.hpp"

namespace ddp::test {

inline constexpr const char* kEtcdBinary = "/usr/bin/etcd";

inline bool etcd_available() { return ::access(kEtcdBinary, X_OK) == 0; }

// n loopback ports the OS chose, all bound at once (so they differ) and then released.
inline std::vector<std::uint16_t> free_loopback_ports(std::size_t n) {
  std::vector<int> fds;
  std::vector<std::uint16_t> ports;
  for (std::size_t i = 0; i < n; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      for (int f : fds) ::close(f);
      if (fd >= 0) ::close(fd);
      throw std::runtime_error("no free loopback port");
    }
    fds.push_back(fd);
    ports.push_back(ntohs(a.sin_port));
  }
  for (int f : fds) ::close(f);
  return ports;
}

inline std::uint16_t free_loopback_port() { return free_loopback_ports(1).front(); }

class EtcdCluster {
 public:
  explicit EtcdCluster(int members = 1) : dir_(make_dir()) {
    const auto ports = free_loopback_ports(2 * static_cast<std::size_t>(members));
    for (std::size_t i = 0; i < ports.size(); i += 2) ports_.push_back({ports[i], ports[i + 1]});
    std::string initial;
    for (int i = 0; i < members; ++i) {
      initial += (i ? "," : "") + name(i) + "=http://127.0.0.1:" + std::to_string(ports_[i].second);
    }
    try {
      for (int i = 0; i < members; ++i) pids_.push_back(spawn(i, initial, members));
      wait_ready();
    } catch (...) {
      stop();  // the destructor does not run when the constructor throws
      throw;
    }
  }
  ~EtcdCluster() { stop(); }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  std::vector<rdzv::Endpoint> endpoints() const {
    std::vector<rdzv::Endpoint> eps;
    for (const auto& p : ports_) eps.push_back({"127.0.0.1", p.first});
    return eps;
  }
  rdzv::etcd::EtcdOptions options(
      std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    rdzv::etcd::EtcdOptions o;
    o.endpoints = endpoints();
    o.timeout = timeout;
    o.connect_timeout = std::chrono::milliseconds(500);
    return o;
  }
  // SIGKILL member i (by the PID this fixture started).
  void kill(int i) {
    pid_t& p = pids_.at(static_cast<std::size_t>(i));
    if (p > 0) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
      p = -1;
    }
  }
  // The index of the member that is the leader now (-1 when none answers as one).
  int leader() const {
    for (std::size_t i = 0; i < ports_.size(); ++i) {
      if (pids_[i] <= 0) continue;
      try {
        rdzv::etcd::EtcdOptions o;
        o.endpoints = {{"127.0.0.1", ports_[i].first}};
        o.timeout = std::chrono::milliseconds(1000);
        rdzv::etcd::EtcdHttp h(o);
        const std::string s = h.post("maintenance/status", "{}");
        const auto at = s.find("\"leader\":\"");
        const auto me = s.find("\"member_id\":\"");
        if (at == std::string::npos || me == std::string::npos) continue;
        const auto lead = s.substr(at + 10, s.find('"', at + 10) - at - 10);
        const auto self = s.substr(me + 13, s.find('"', me + 13) - me - 13);
        if (lead == self) return static_cast<int>(i);
      } catch (const std::exception&) {
      }
    }
    return -1;
  }

 private:
  void stop() {
    for (pid_t& p : pids_) {
      if (p > 0) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
        p = -1;
      }
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  static std::string name(int i) { return "e" + std::to_string(i + 1); }
  static std::string make_dir() {
    char tmpl[] = "/dev/shm/ddp-etcd-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    return tmpl;
  }
  pid_t spawn(int i, const std::string& initial, int members) {
    const std::string client = "http://127.0.0.1:" + std::to_string(ports_[i].first);
    const std::string peer = "http://127.0.0.1:" + std::to_string(ports_[i].second);
    const std::string data = dir_ + "/" + name(i);
    const std::string log = dir_ + "/" + name(i) + ".log";
    std::vector<std::string> args = {kEtcdBinary,
                                     "--name",
                                     name(i),
                                     "--data-dir",
                                     data,
                                     "--listen-client-urls",
                                     client,
                                     "--advertise-client-urls",
                                     client,
                                     "--listen-peer-urls",
                                     peer,
                                     "--initial-advertise-peer-urls",
                                     peer,
                                     "--initial-cluster",
                                     initial,
                                     "--initial-cluster-state",
                                     "new",
                                     "--initial-cluster-token",
                                     "ddp-test-" + std::to_string(::getpid()),
                                     "--heartbeat-interval",
                                     members == 1 ? "10" : "50",
                                     "--election-timeout",
                                     members == 1 ? "100" : "500",
                                     "--quota-backend-bytes",
                                     std::to_string(64 << 20),
                                     "--logger",
                                     "zap",
                                     "--log-outputs",
                                     log};
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(kEtcdBinary, argv.data());
      ::_exit(127);
    }
    if (pid < 0) throw std::runtime_error("fork failed");
    return pid;
  }
  void wait_ready() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (leader() >= 0) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error("etcd did not elect a leader within 20 s (logs in " + dir_ + ")");
  }

  std::string dir_;
  std::vector<std::pair<std::uint16_t, std::uint16_t>> ports_;  // client, peer
  std::vector<pid_t> pids_;
};

}  // namespace ddp::test
