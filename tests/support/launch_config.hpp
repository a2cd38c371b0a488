// A LaunchConfig from a ddprun command line (without "ddprun"), for the launcher's unit tests;
// the parse must succeed.
#pragma once

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "ddp/launch/config.hpp"

namespace ddp::test {

inline launch::LaunchConfig parsed_config(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  auto r = launch::parse_launch_args(args, {});
  REQUIRE(r.config.has_value());
  return *r.config;
}

}  // namespace ddp::test
