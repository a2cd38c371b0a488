// TLS on the store's own connections (issue 35, docs/security.md "TLS on the store"), on a real
// server and real sockets, in process, so the sanitizer builds see the server's TLS paths: a
// TLS client and a plain one share the port; a second connection of the same context resumes
// the first one's session; a client without TLS to a store that wants a certificate still works
// over plain (the policy is the access rules'). Certificates made by the openssl command line in
// a private temporary folder. Bounded: a few connections, 5 s per reply.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/server.hpp"
#include "ddp/rdzv/tls.hpp"
#include "support/skip.hpp"

using namespace ddp::rdzv;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// A CA and a node certificate for 127.0.0.1 (server and client use), EC P-256. Empty when the
// openssl command is missing or fails.
struct Pki {
  fs::path dir;
  bool ok = false;
  Pki() {
    char tmpl[] = "/tmp/ddp-tls-test-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return;
    dir = tmpl;
    std::ofstream(dir / "node.ext")
        << "subjectAltName = IP:127.0.0.1\nextendedKeyUsage = serverAuth, clientAuth\n";
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes ";
    const std::string cd = "cd '" + dir.string() + "' && timeout 30 openssl ";
    ok = std::system((cd + "req -x509" + ec + "-keyout ca.key -out ca.pem -subj /CN=ca -days 2" +
                      " 2>/dev/null && " + cd + "req" + ec +
                      "-keyout node.key -out node.csr -subj /CN=node 2>/dev/null && " + cd +
                      "x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out "
                      "node.pem -days 2 -extfile node.ext 2>/dev/null")
                         .c_str()) == 0;
  }
  ~Pki() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
  TlsOptions options() const {
    TlsOptions o;
    o.on = true;
    o.read_ahead = true;  // as the store's knobs set them (store_tls.cpp)
    o.cacert = {(dir / "ca.pem").string(), "ca"};
    o.cert = {(dir / "node.pem").string(), "cert"};
    o.key = {(dir / "node.key").string(), "key"};
    return o;
  }
};

ClientOptions quick(std::shared_ptr<const TlsContext> tls) {
  ClientOptions o;
  o.timeout = 5s;
  o.connect_timeout = 5s;
  o.tls = std::move(tls);
  return o;
}

}  // namespace

TEST_CASE("store TLS: TLS and plain clients share the port, and a reconnect resumes") {
  Pki pki;
  if (!pki.ok) DDP_SKIP("the openssl command could not make test certificates");
  ServerOptions so;
  so.tls = std::make_shared<const TlsContext>(pki.options(), TlsRole::server);
  StoreServer server(so);
  server.start();
  auto tls = std::make_shared<const TlsContext>(pki.options());

  StoreClient first("127.0.0.1", server.port(), quick(tls));
  first.set("/k", std::string(100000, 'v'));  // larger than one TLS record
  CHECK(first.get("/k") == std::string(100000, 'v'));
  CHECK_FALSE(first.tls_resumed());

  StoreClient plain("127.0.0.1", server.port(), quick(nullptr));
  CHECK(plain.get("/k").size() == 100000);
  CHECK(plain.add("/n", 2) == 2);

  StoreClient second("127.0.0.1", server.port(), quick(tls));
  CHECK(second.add("/n", 3) == 5);
  CHECK(second.tls_resumed());  // the first connection's session, no certificates exchanged
  CHECK(server.stats().tls_connections == 2);
  for (int i = 0; i < 200; ++i) second.add("/c", 1);  // records back to back, read ahead
  CHECK(first.add("/c", 0) == 200);
  // A WAIT that another connection's SET ends, across TLS and plain.
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    plain.set("/late", "x");
  });
  second.wait({"/late"}, 5000ms);
  setter.join();
  CHECK(second.get("/late") == "x");
}

TEST_CASE("store TLS: a store gone mid-connection is an error, not SIGPIPE") {
  Pki pki;
  if (!pki.ok) DDP_SKIP("the openssl command could not make test certificates");
  auto server = std::make_unique<StoreServer>([&] {
    ServerOptions so;
    so.tls = std::make_shared<const TlsContext>(pki.options(), TlsRole::server);
    return so;
  }());
  server->start();
  StoreClient c("127.0.0.1", server->port(),
                quick(std::make_shared<const TlsContext>(pki.options())));
  c.set("/k", "v");
  struct sigaction now {};
  REQUIRE(::sigaction(SIGPIPE, nullptr, &now) == 0);
  CHECK(now.sa_handler == SIG_IGN);  // a TLS context made the process ignore it
  server.reset();                    // the store goes away; its sockets close
  bool failed = false;
  for (int i = 0; i < 50 && !failed; ++i) {  // the first writes may still be taken by the kernel
    try {
      c.set("/k", std::string(65536, 'x'));
    } catch (const ddp::Error&) {
      failed = true;
    }
  }
  CHECK(failed);
}

TEST_CASE("store TLS: a plain store answering a TLS client is named") {
  Pki pki;
  if (!pki.ok) DDP_SKIP("the openssl command could not make test certificates");
  StoreServer server(ServerOptions{});
  server.start();
  auto tls = std::make_shared<const TlsContext>(pki.options());
  try {
    StoreClient c("127.0.0.1", server.port(), quick(tls));
    FAIL("a plain store served a TLS client");
  } catch (const ddp::Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("TLS") != std::string::npos);
  }
}
