// A real StoreServer on 127.0.0.1:0 with clients for it, and eventually(): the integration
// tests' shared fixture. No sleeps in tests: every wait is a bounded poll for a condition.
#pragma once

#include <chrono>
#include <memory>
#include <thread>

#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/server.hpp"

namespace ddp::test {

struct ServerFixture {
  rdzv::StoreServer server;
  explicit ServerFixture(rdzv::ServerOptions o) : server(std::move(o)) { server.start(); }
  std::unique_ptr<rdzv::StoreClient> client(rdzv::ClientOptions o = {}) {
    o.connect_timeout = std::chrono::seconds(5);
    if (o.timeout == std::chrono::milliseconds(30000)) o.timeout = std::chrono::seconds(5);
    return std::make_unique<rdzv::StoreClient>("127.0.0.1", server.port(), o);
  }
};

template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

}  // namespace ddp::test
