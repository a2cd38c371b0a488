// Catch2 v2's implementation, compiled once per tree and shared by every test executable (its
// single header is among the slowest things this project compiles), and the one call into its
// session (catch_run.hpp): Catch2 declares Session only where its implementation is compiled.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

#include "support/catch_run.hpp"
#include "support/skip.hpp"

namespace {

// Catch2 v2 counts a case ended by DDP_SKIP as passed: every run ends by naming each skipped
// case and its reason, and its count, so a skip shows wherever the binary runs (ctest counts
// them through SKIP_REGULAR_EXPRESSION, scripts/count_tests.py through DDP_TEST_REPORT).
struct SkipSummary : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunEnded(const Catch::TestRunStats& stats) override {
    const auto& skipped = ddp::test::skipped_cases();
    if (skipped.empty()) return;
    std::cout << "DDP_SKIPPED_CASES: " << skipped.size() << " of " << stats.totals.testCases.total()
              << " test cases were skipped (Catch2 counts them "
              << "as passed):\n";
    for (const auto& s : skipped) std::cout << "  skipped: " << s.test << ": " << s.reason << "\n";
    std::cout.flush();
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(SkipSummary)

int ddp_catch_run(int argc, char** argv) { return Catch::Session().run(argc, argv); }
