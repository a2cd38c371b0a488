// ddprun: the torchrun-compatible launcher. Parses torchrun's command line (and PET_*), then
// runs the node's agent; the exit code carries the first failure's code or 128 + signal.
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "ddp/launch/agent.hpp"
#include "ddp/launch/worker_env.hpp"
#include "ddp/proto/error.hpp"

extern char** environ;

int main(int argc, char** argv) {
  ddp::launch::EnvMap env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  auto parsed = ddp::launch::parse_launch_args(std::vector<std::string>(argv, argv + argc), env);
  if (!parsed.config) {
    (parsed.exit_code == 0 ? std::cout : std::cerr) << parsed.message << "\n";
    return parsed.exit_code;
  }
  if (!parsed.notice.empty()) std::cerr << parsed.notice << "\n";
  // Unlike torchrun, a compiled program (ELF) needs no --no-python: python could not run it.
  auto& config = *parsed.config;
  // A bare name that is no file here but a program on PATH (`ddprun ddp-train ...`) is found
  // as exec finds it.
  if (!config.no_python && !config.module && !config.run_path) {
    std::string program = config.entrypoint;
    std::error_code ec;
    if (!std::filesystem::exists(program, ec)) {
      auto path = env.find("PATH");
      program = ddp::launch::find_on_path(program, path == env.end() ? "" : path->second);
    }
    if (!program.empty() && ddp::launch::is_native_executable(program)) config.no_python = true;
  }
  try {
    return ddp::launch::run_agent(config, env);
  } catch (const ddp::ConfigError& e) {
    std::cerr << "ddprun: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "ddprun: " << e.what() << "\n";
    return 1;
  }
}
