// ddpstore: a command-line client for ddprund (and torch's TCPStore with --torch):
//   ddpstore --endpoint HOST[:PORT] set KEY VALUE | get KEY | add KEY N | wait KEY... |
//            check KEY... | delete KEY | num-keys | list-keys | ping
#include <CLI/CLI.hpp>
#include <charconv>
#include <iostream>

#include "ddp/proto/version.hpp"
#include "ddp/proto/auth.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/store_tls.hpp"

int main(int argc, char** argv) {
  std::string endpoint;
  bool torch = false;
  long timeout_ms = 30000;
  std::vector<std::string> args;
  CLI::App app{"ddpstore: talk to a ddprund / c10d TCPStore server"};
  app.set_version_flag("--version", ddp::version_line("ddpstore"));
  app.add_option("--endpoint", endpoint, "HOST:PORT, [IPV6]:PORT or HOST (port 29400) of the store")
      ->required();
  app.add_flag("--torch", torch, "plain torch protocol (no ddprun extensions)");
  app.add_option("--timeout-ms", timeout_ms, "timeout of each operation")->capture_default_str();
  std::string secret_file;
  app.add_option("--secret-file", secret_file,
                 "a file (yours, mode 600) holding the store secret, as ddprund's; "
                 "DDPRUN_STORE_SECRET(_FILE) work too (docs/security.md)");
  app.add_option("command", args,
                 "set KEY VALUE | get KEY | add KEY N | wait KEY... | "
                 "check KEY... | delete KEY | num-keys | list-keys | ping")
      ->required();
  CLI11_PARSE(app, argc, argv);

  ddp::rdzv::Endpoint ep;
  try {
    ep = ddp::rdzv::parse_endpoint(endpoint, 29400, "--endpoint");
  } catch (const ddp::ConfigError& e) {
    std::cerr << "ddpstore: " << e.what() << "\n";
    return 2;
  }
  try {
    ddp::rdzv::ClientOptions o;
    o.timeout = std::chrono::milliseconds(timeout_ms);
    o.connect_timeout = std::chrono::milliseconds(timeout_ms);
    o.extensions = !torch;
    // The job's secret: a file or the environment (never the value as a flag: ps would show it).
    if (auto secret = ddp::proto::auth::secret_for(secret_file)) o.secret = std::move(*secret);
    o.tls = ddp::rdzv::store_client_tls();  // DDPRUN_STORE_TLS_*
    ddp::rdzv::StoreClient c(ep, o);
    const std::string& cmd = args[0];
    std::vector<std::string> rest(args.begin() + 1, args.end());
    auto need = [&](std::size_t n) {
      if (rest.size() != n) {
        throw ddp::ConfigError(cmd + " takes " + std::to_string(n) + " argument(s)");
      }
    };
    if (cmd == "set") {
      need(2);
      c.set(rest[0], rest[1]);
    } else if (cmd == "get") {
      need(1);
      std::cout << c.get(rest[0]) << "\n";
    } else if (cmd == "add") {
      need(2);
      long long delta = 0;
      auto [end, ec] = std::from_chars(rest[1].data(), rest[1].data() + rest[1].size(), delta);
      if (ec != std::errc() || end != rest[1].data() + rest[1].size()) {
        throw ddp::ConfigError("add: '" + rest[1] + "' is not an integer");
      }
      std::cout << c.add(rest[0], delta) << "\n";
    } else if (cmd == "wait") {
      c.wait(rest);
    } else if (cmd == "check") {
      std::cout << (c.check(rest) ? "ready" : "not ready") << "\n";
    } else if (cmd == "delete") {
      need(1);
      std::cout << (c.delete_key(rest[0]) ? "deleted" : "absent") << "\n";
    } else if (cmd == "num-keys") {
      std::cout << c.num_keys() << "\n";
    } else if (cmd == "list-keys") {
      for (const auto& k : c.list_keys()) std::cout << k << "\n";
    } else if (cmd == "ping") {
      std::cout << (c.ping(4242) == 4242 ? "pong" : "bad pong") << "\n";
    } else {
      std::cerr << "ddpstore: unknown command '" << cmd << "'\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "ddpstore: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
