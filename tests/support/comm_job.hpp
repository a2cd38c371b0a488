// N ranks as threads, each with a real communicator over a real store server: the fixture of
// the communicator tests (comm_test.cpp, collectives_test.cpp). Catch2 v2's assertions are not
// thread-safe, so rank threads check with expect() (it throws) and run() rethrows the first
// failure on the test's own thread (run_ranks).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/server.hpp"
#include "ddp/worker/comm.hpp"
#include "ranks.hpp"
#include "store_fixture.hpp"

namespace ddp::test {

inline void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("expected: " + what);
}

struct CommJob : ServerFixture {
  explicit CommJob(std::chrono::milliseconds timeout = std::chrono::seconds(20))
      : ServerFixture([] {
          rdzv::ServerOptions o;
          o.threads = 2;
          return o;
        }()),
        timeout_(timeout) {}

  worker::CommOptions options(int rank, int size, const std::string& prefix) {
    rdzv::ClientOptions co;
    co.timeout = timeout_;
    worker::CommOptions o;
    o.rank = rank;
    o.size = size;
    o.store = std::shared_ptr<rdzv::StoreClient>(client(co));
    o.key_prefix = prefix;
    o.timeout = timeout_;
    return o;
  }

  // Runs body(comm) on n ranks as threads over `backend`: "gloo", or "shm" (shared memory over
  // gloo, as ddp-train uses between the ranks of one host).
  void run(const std::string& backend, int n, const std::string& prefix,
           const std::function<void(worker::Communicator&)>& body) {
    run_ranks(n, [&](int r) {
      const worker::CommOptions o = options(r, n, prefix);
      auto comm = worker::make_gloo_communicator(o);
      if (backend == "shm") {
        comm = worker::make_local_communicator(std::move(comm), o);
        expect(std::string(comm->backend()) == "gloo+shm", "the shared-memory communicator");
      }
      body(*comm);
    });
  }
  void run(int n, const std::string& prefix,
           const std::function<void(worker::Communicator&)>& body) {
    run("gloo", n, prefix, body);
  }

 private:
  std::chrono::milliseconds timeout_;
};

}  // namespace ddp::test
