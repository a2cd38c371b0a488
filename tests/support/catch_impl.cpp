// Catch2 v2's implementation, compiled once per tree and shared by every test executable (its
// single header is among the slowest things this project compiles), and the one call into its
// session (catch_run.hpp): Catch2 declares Session only where its implementation is compiled.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_run.hpp"

int ddp_catch_run(int argc, char** argv) { return Catch::Session().run(argc, argv); }
