// ddprund: the standalone rendezvous store daemon. Serves the c10d TCPStore protocol (torch
// 2.x and 1.13 clients) plus ddprun's lease extensions until SIGTERM or SIGINT, and the
// status views of every run in its store over HTTP (docs/status.md).
#include <pwd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>

#include "ddp/proto/version.hpp"
#include "ddp/proto/auth.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/rdzv/access.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/fd_limit.hpp"
#include "ddp/rdzv/log.hpp"
#include "ddp/rdzv/server.hpp"
#include "ddp/rdzv/store_tls.hpp"
#include "ddp/status/http_auth.hpp"
#include "ddp/status/http_server.hpp"
#include "ddp/status/views.hpp"

namespace {

// Writes "<port>\n" to a temporary file renamed over `path`: readers never see half of it.
bool write_port_file(const std::string& path, std::uint16_t port) {
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp);
  out << port << "\n";
  out.close();
  return out && std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Where this process reaches its own store: loopback when it binds every interface.
std::string local_address(const std::string& host) {
  if (host.empty() || host == "0.0.0.0") return "127.0.0.1";
  if (host == "::" || host == "[::]") return "::1";
  return host;
}

std::string url_host(const std::string& host) {
  return host.find(':') != std::string::npos && host.front() != '[' ? "[" + host + "]" : host;
}

}  // namespace

int main(int argc, char** argv) {
  ddp::rdzv::ServerOptions opts;
  std::string port_file;
  std::string http_host, http_port_file;
  int http_port = 0;
  CLI::App app{"ddprund: c10d TCPStore-compatible rendezvous store daemon"};
  app.set_version_flag("--version", ddp::version_line("ddprund"));
  app.add_option("--host", opts.host,
                 "address to bind (only this one; 0.0.0.0 or :: for every interface)")
      ->capture_default_str();
  app.add_option("--port", opts.port, "TCP port; 0 picks a free one and prints it")
      ->capture_default_str();
  app.add_option("--port-file", port_file, "write the bound port to this file once listening");
  app.add_option("--threads", opts.threads, "event-loop threads (0: half the cores, 1 to 4)")
      ->capture_default_str()
      ->check(CLI::Range(0u, 64u));
  app.add_option("--max-connections", opts.max_connections, "connections served at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-store-bytes", opts.max_store_bytes,
                 "total bytes of keys, values and queues (each +64); 0: no limit")
      ->capture_default_str();
  app.add_option("--max-key-bytes", opts.limits.max_key_bytes, "largest key")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-value-bytes", opts.limits.max_value_bytes, "largest value")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-keys-per-request", opts.limits.max_keys_per_request,
                 "most keys in one CHECK/WAIT/MULTI_GET/MULTI_SET")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-connection-bytes", opts.max_connection_bytes,
                 "memory held for one client (unparsed input, unsent replies, its WAIT); over "
                 "it the request gets the reason and the connection closes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-client-bytes", opts.max_client_bytes,
                 "the same, for all connections together")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-leases-per-connection", opts.max_leases_per_connection,
                 "live leases one connection may grant (0: no limit)")
      ->capture_default_str();
  double frame_timeout_s = static_cast<double>(opts.frame_timeout.count()) / 1000;
  app.add_option("--frame-timeout", frame_timeout_s,
                 "seconds to finish a request once its first byte came (0: no deadline)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--backlog", opts.backlog, "listen backlog (capped by net.core.somaxconn)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  std::string secret_file, allow_unauthenticated;
  app.add_option("--secret-file", secret_file,
                 "a file (yours, mode 600) holding the store secret: clients outside "
                 "--allow-unauthenticated must authenticate with it; DDPRUN_STORE_SECRET(_FILE) "
                 "work too (docs/security.md)");
  app.add_option("--allow-unauthenticated", allow_unauthenticated,
                 "with a secret: networks (CIDRs, comma-separated) whose clients may use the store "
                 "without authenticating, for torch clients such as torchrun's c10d agents");
  std::string allow_uids = "any";
  app.add_option("--allow-uids", allow_uids,
                 "who may use the store over loopback: `any` local user, or, besides ddprund's "
                 "own user and root, these (comma-separated uids or names; \"\": nobody else)")
      ->capture_default_str();
  app.add_option("--http-host", http_host,
                 "address of the HTTP status views (/, /api/status, /api/runs, /metrics); "
                 "default: --host");
  app.add_option("--http-port", http_port, "their TCP port; 0 picks a free one; -1: no HTTP")
      ->capture_default_str()
      ->check(CLI::Range(-1, 65535));
  std::string http_token_file, http_tls_cert, http_tls_key;
  app.add_option("--http-tls-cert", http_tls_cert,
                 "serve the HTTP views over HTTPS only, with this certificate chain (PEM)");
  app.add_option("--http-tls-key", http_tls_key, "the private key (PEM) of --http-tls-cert");
  app.add_option("--http-token-file", http_token_file,
                 "the HTTP views ask for this token (a file of yours, mode 600) on every route "
                 "but /healthz; default: the store secret, when there is one");
  app.add_option("--http-port-file", http_port_file,
                 "write the bound HTTP port to this file once listening");
  app.add_option("--data-dir", opts.data_dir,
                 "keep the store's state in this directory (a journal and a snapshot), so that "
                 "a restarted ddprund loses nothing (docs/rendezvous.md)");
  double fsync_s = static_cast<double>(opts.fsync_interval.count()) / 1000;
  app.add_option("--fsync-interval", fsync_s,
                 "with --data-dir: seconds between fdatasyncs of the journal (0: before every "
                 "reply); a change is always written before its reply, so a killed ddprund "
                 "loses nothing, and a crashed host at most this much")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60.0));
  app.add_option("--journal-max-bytes", opts.journal_compact_bytes,
                 "with --data-dir: compact the journal into a snapshot past this size (or twice "
                 "the snapshot's)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{4096}, std::size_t{1} << 40));
  CLI11_PARSE(app, argc, argv);
  opts.fsync_interval = std::chrono::milliseconds(static_cast<long>(fsync_s * 1000));
  if (http_host.empty()) http_host = opts.host;
  opts.frame_timeout = std::chrono::milliseconds(static_cast<long>(frame_timeout_s * 1000));

  // Block the stop signals before any thread starts, so that only sigwait() below sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  ddp::rdzv::raise_fd_limit();

  auto& log = ddp::logger("rdzv");
  try {
    if (auto secret = ddp::proto::auth::secret_for(secret_file)) opts.secret = std::move(*secret);
    // DDPRUN_STORE_TLS_* (store_tls.hpp): TLS and plain on the one port.
    if (const ddp::rdzv::StoreTls tls = ddp::rdzv::store_tls(); tls.files.on) {
      opts.tls =
          std::make_shared<const ddp::rdzv::TlsContext>(tls.files, ddp::rdzv::TlsRole::server);
      opts.tls_only = tls.only;
    }
    if (!allow_unauthenticated.empty()) {
      if (opts.secret.empty()) {
        throw ddp::ConfigError(
            "--allow-unauthenticated needs a secret (--secret-file or DDPRUN_STORE_SECRET): "
            "without one every client is admitted");
      }
      opts.trusted = ddp::rdzv::parse_cidrs(allow_unauthenticated, "--allow-unauthenticated");
    }
    opts.loopback_uids =
        ddp::rdzv::parse_uids(allow_uids, "--allow-uids", [](const std::string& name) {
          const passwd* p = ::getpwnam(name.c_str());
          return p == nullptr ? std::nullopt
                              : std::optional<std::uint32_t>(static_cast<std::uint32_t>(p->pw_uid));
        });
    ddp::rdzv::IpAddr bound;
    const bool loopback_only =
        opts.host == "localhost" || (ddp::rdzv::parse_ip(opts.host, bound) && bound.is_loopback());
    if (opts.secret.empty() && !opts.tls_only && !loopback_only) {
      log.warn(
          "no store secret: anyone who reaches {}:{} can read, write and end the jobs in "
          "this store; set DDPRUN_STORE_SECRET_FILE (docs/security.md)",
          opts.host, opts.port);
    }
    ddp::rdzv::StoreServer server(opts);
    server.start();
    if (!opts.data_dir.empty()) {
      const auto r = server.replayed();
      std::cout << "ddprund: restored " << r.keys << " keys and " << r.leases << " leases from "
                << opts.data_dir << " (" << r.records << " records)" << std::endl;
    }
    std::cout << "ddprund listening on " << opts.host << ":" << server.port()
              << (opts.secret.empty() ? "" : " (clients must authenticate)")
              << (!opts.tls       ? ""
                  : opts.tls_only ? " (TLS only)"
                                  : " (TLS and plain)")
              << std::endl;
    // The views read the store through a client of their own, on the HTTP thread; short
    // timeouts, since every HTTP connection waits while a request is answered.
    ddp::status::ViewSources sources;
    sources.connect = [host = local_address(opts.host), port = server.port(),
                       secret = opts.secret] {
      ddp::rdzv::ClientOptions co;
      co.secret = secret;
      co.timeout = std::chrono::milliseconds(3000);
      co.connect_timeout = std::chrono::milliseconds(1000);
      return std::unique_ptr<ddp::rdzv::Store>(
          std::make_unique<ddp::rdzv::StoreClient>(host, port, co));
    };
    sources.store_stats = [&server] { return server.stats(); };
    ddp::status::StatusViews views(std::move(sources));
    std::optional<ddp::status::HttpServer> http;
    if (http_port >= 0) {
      ddp::status::HttpOptions ho;
      ho.host = http_host;
      ho.port = static_cast<std::uint16_t>(http_port);
      if (http_tls_cert.empty() != http_tls_key.empty()) {
        throw ddp::ConfigError("--http-tls-cert and --http-tls-key go together");
      }
      ho.tls_cert = http_tls_cert;
      ho.tls_key = http_tls_key;
      ho.token = ddp::status::views_token(
          http_token_file, opts.secret.empty() ? std::nullopt : std::optional(opts.secret));
      http.emplace(ho, [&views](const ddp::status::HttpRequest& r) { return views.handle(r); });
      http->start();
      std::cout << "ddprund: status page at http" << (http_tls_cert.empty() ? "" : "s") << "://"
                << url_host(http_host) << ":" << http->port() << "/"
                << (ho.token.empty() ? ""
                                     : " (with the token: ?token=..., or Authorization: Bearer)")
                << std::endl;
      if (!http_port_file.empty() && !write_port_file(http_port_file, http->port())) {
        log.error("cannot write --http-port-file {}: {}", http_port_file, std::strerror(errno));
        return 1;
      }
    }
    if (!port_file.empty() && !write_port_file(port_file, server.port())) {
      log.error("cannot write --port-file {}: {}", port_file, std::strerror(errno));
      return 1;
    }
    int sig = 0;
    sigwait(&stop_signals, &sig);
    log.info("received signal {}, shutting down", sig);
    if (http) http->stop();  // first: its views hold a client of the store
    server.stop();
    auto st = server.stats();
    log.info(
        "served {} connections, {} requests; closed {} for protocol errors, {} for an "
        "unfinished request, {} over a memory budget; {} authenticated, refused {} "
        "unauthenticated and {} with a wrong proof",
        st.connections_total, st.requests, st.protocol_errors, st.frame_timeouts, st.over_budget,
        st.auth_ok, st.refused_unauthenticated, st.auth_failures);
    if (http) {
      const auto hs = http->stats();
      log.info(
          "http: {} connections, {} replies; {} refused over the connection limit, {} timed "
          "out, {} bad requests",
          hs.connections_total, hs.requests, hs.connections_refused, hs.timeouts, hs.rejected);
    }
  } catch (const ddp::Error& e) {
    log.error("{}", e.what());
    return ddp::exit_code(e.code());  // 2 for a bad setting, 1 for the rest
  }
  return 0;
}
