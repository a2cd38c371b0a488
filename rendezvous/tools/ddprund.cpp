// ddprund: the standalone rendezvous store daemon. Serves the c10d TCPStore protocol (torch
// 2.x and 1.13 clients) plus ddprun's lease extensions until SIGTERM or SIGINT.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/fd_limit.hpp"
#include "ddp/rdzv/log.hpp"
#include "ddp/rdzv/server.hpp"

int main(int argc, char** argv) {
  ddp::rdzv::ServerOptions opts;
  std::string port_file;
  CLI::App app{"ddprund: c10d TCPStore-compatible rendezvous store daemon"};
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
  CLI11_PARSE(app, argc, argv);
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
    ddp::rdzv::StoreServer server(opts);
    server.start();
    std::cout << "ddprund listening on " << opts.host << ":" << server.port() << std::endl;
    if (!port_file.empty()) {
      std::string tmp = port_file + ".tmp";
      std::ofstream out(tmp);
      out << server.port() << "\n";
      out.close();
      // rename: readers never see a half-written file
      if (!out || std::rename(tmp.c_str(), port_file.c_str()) != 0) {
        log.error("cannot write --port-file {}: {}", port_file, std::strerror(errno));
        return 1;
      }
    }
    int sig = 0;
    sigwait(&stop_signals, &sig);
    log.info("received signal {}, shutting down", sig);
    server.stop();
    auto st = server.stats();
    log.info(
        "served {} connections, {} requests; closed {} for protocol errors, {} for an "
        "unfinished request, {} over a memory budget",
        st.connections_total, st.requests, st.protocol_errors, st.frame_timeouts, st.over_budget);
  } catch (const ddp::Error& e) {
    log.error("{}", e.what());
    return ddp::exit_code(e.code());  // 2 for a bad setting, 1 for the rest
  }
  return 0;
}
