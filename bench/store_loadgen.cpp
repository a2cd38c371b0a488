// store_loadgen: drives a c10d TCPStore server (ddprund or torch's own) over the raw torch 2.x
// wire protocol, so one binary measures both. --mode mix: closed-loop SET/GET/ADD/WAIT traffic
// from C connections on T epoll threads -> one JSON line with throughput and latency.
// --mode storm: N clients connect at once and do init_process_group's ADD + WAIT barrier -> one
// JSON line with the wall time.
// The modes live in loadgen_mix.cpp and loadgen_storm.cpp, the wire helpers in loadgen_wire.*;
// this file is the command line.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <exception>
#include <string>

#include "ddp/rdzv/fd_limit.hpp"
#include "loadgen_modes.hpp"
#include "loadgen_wire.hpp"

int main(int argc, char** argv) {
  std::string mode, host = "127.0.0.1";
  int port = 0, clients = 1024;
  double timeout_s = 30;
  loadgen::MixConfig cfg;
  CLI::App app{"store_loadgen: load generator for c10d TCPStore servers (torch 2.x wire)"};
  app.add_option("--mode", mode, "mix | storm")->required()->check(CLI::IsMember({"mix", "storm"}));
  app.add_option("--host", host, "server address")->capture_default_str();
  app.add_option("--port", port, "server port")->required()->check(CLI::Range(1, 65535));
  app.add_option("--threads", cfg.threads, "client threads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--connections", cfg.connections, "mix: connections")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--duration-s", cfg.duration_s, "mix: measured seconds")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup-s", cfg.warmup_s, "mix: seconds before measuring")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mix", cfg.mix, "mix: op weights")->capture_default_str();
  app.add_option("--keys", cfg.keys, "mix: key space")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--value-bytes", cfg.value_bytes, "mix: value size")->capture_default_str();
  app.add_option("--seed", cfg.seed, "mix: PRNG seed")->capture_default_str();
  app.add_option("--server-pid", cfg.server_pid,
                 "mix: also report this process's CPU time per op (read from /proc)");
  app.add_option("--clients", clients, "storm: clients")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--timeout-s", timeout_s, "storm: give up after this long")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::signal(SIGPIPE, SIG_IGN);
  ddp::rdzv::raise_fd_limit();
  try {
    cfg.ep = loadgen::resolve(host, port);
    if (mode == "mix") return loadgen::run_mix(cfg);
    return loadgen::run_storm(cfg.ep, clients, cfg.threads, timeout_s);
  } catch (const std::exception& e) {
    std::printf("{\"mode\":\"%s\",\"error\":\"%s\",\"errors\":1}\n", mode.c_str(), e.what());
    return 1;
  }
}
