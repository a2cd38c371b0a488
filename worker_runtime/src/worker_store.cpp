// The worker's connection to the job's store (WorkerStore), and the local address peers reach
// this rank on (local_address_towards).
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "ddp/proto/auth.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/store_tls.hpp"
#include "ddp/rdzv/server.hpp"
#include "ddp/worker/comm.hpp"
#include "ddp/worker/env.hpp"

namespace ddp::worker {

struct WorkerStore::Hosted {
  rdzv::StoreServer server;
  explicit Hosted(rdzv::ServerOptions o) : server(std::move(o)) {}
};

WorkerStore::WorkerStore(const WorkerEnv& env) {
  if (!env.use_agent_store && env.rank == 0) {
    rdzv::ServerOptions o;
    o.host = "0.0.0.0";
    o.port = env.master_port;
    o.threads = 1;
    hosted_ = std::make_unique<Hosted>(o);
    try {
      hosted_->server.start();
    } catch (const std::exception& e) {
      throw IoError("rank 0 cannot host the store on MASTER_PORT=" +
                    std::to_string(env.master_port) + ": " + e.what());
    }
  }
  try {
    // Plain TCPStore requests (under torchrun the agent's store is torch's own server), unless
    // the job has a secret: then ddprun's store is asked to let it in (docs/security.md), and a
    // torch store, which closes the connection at HELLO, is used plainly.
    rdzv::ClientOptions co;
    co.extensions = false;
    co.tls = rdzv::store_client_tls();  // DDPRUN_STORE_TLS_*: the store's TLS (null: plain)
    if (auto secret = proto::auth::job_secret()) {
      co.extensions = true;
      co.secret = std::move(*secret);
      try {
        client_ = std::make_shared<rdzv::StoreClient>(env.master_addr, env.master_port, co);
      } catch (const ProtocolError&) {
        co.extensions = false;
      }
    }
    if (!client_) {
      client_ = std::make_shared<rdzv::StoreClient>(env.master_addr, env.master_port, co);
    }
  } catch (const std::exception& e) {
    throw IoError("cannot reach the job's store at MASTER_ADDR=" + env.master_addr +
                  " MASTER_PORT=" + std::to_string(env.master_port) + ": " + e.what());
  }
}

WorkerStore::~WorkerStore() {
  client_.reset();
  if (hosted_) hosted_->server.stop();
}

std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(host.c_str(), "9", &hints, &res); rc != 0) {
    throw ConfigError("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  }
  std::string out;
  for (addrinfo* ai = res; ai != nullptr && out.empty(); ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {};
      const void* addr =
          local.ss_family == AF_INET6
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
      if (::inet_ntop(local.ss_family, addr, buf, sizeof buf) != nullptr) out = buf;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (out.empty()) throw IoError("no local address has a route to '" + host + "'");
  return out;
}

}  // namespace ddp::worker
