// DDP_SKIP(message): ends a Catch2 test case as skipped, visibly (and every run of a test binary
// ends by listing its skipped cases with their reasons: catch_impl.cpp). Catch2 v2 has no skip, and
// a test that returns early passes; so the message goes to stdout behind "DDP_SKIPPED: ", which
// tests/CMakeLists.txt gives ctest as SKIP_REGULAR_EXPRESSION: ctest then counts the case as
// skipped ("***Skipped"), and its reason goes to the report scripts/test.sh prints at the end
// (DDP_TEST_REPORT, skip.cpp). In a suite that ctest runs whole (the GPU tests), the report's
// line is what counts the skip (scripts/count_tests.py).
// DDP_SKIP_TOOL(message): the same for a tool that scripts/setup.sh installs (etcd, py-spy,
// eu-stack, the torch venv): a failure where DDP_REQUIRE_TOOLS=1 (scripts/test.sh), since there
// a missing tool is a broken set-up, not a machine without it.
#pragma once

#include <catch2/catch.hpp>

#include <sstream>
#include <string>
#include <vector>

namespace ddp::test {

// Prints "DDP_SKIPPED: reason" and appends it to DDP_TEST_REPORT, if set, as one JSON line.
void note_skip(const std::string& reason);
// The same for a whole suite that skips before Catch2 runs (the GPU tests without a device):
// its suite is DDP_SUITE (the ctest name, tests/CMakeLists.txt).
void note_suite_skip(const std::string& reason);
// True when DDP_REQUIRE_TOOLS=1.
bool tools_required();
// The cases this run skipped, with their reasons, in order (catch_impl.cpp prints them at the
// end of every run: Catch2 itself counts them as passed).
struct SkippedCase {
  std::string test, reason;
};
const std::vector<SkippedCase>& skipped_cases();

}  // namespace ddp::test

#define DDP_SKIP(message)                        \
  do {                                           \
    std::ostringstream ddp_skip_reason;          \
    ddp_skip_reason << message;                  \
    ddp::test::note_skip(ddp_skip_reason.str()); \
    WARN("skipped: " << ddp_skip_reason.str());  \
    return;                                      \
  } while (false)

#define DDP_SKIP_TOOL(message)                                                               \
  do {                                                                                       \
    std::ostringstream ddp_skip_reason;                                                      \
    ddp_skip_reason << "missing tool: " << message;                                          \
    if (ddp::test::tools_required())                                                         \
      FAIL(ddp_skip_reason.str() << " (DDP_REQUIRE_TOOLS=1: a missing tool fails the run)"); \
    ddp::test::note_skip(ddp_skip_reason.str());                                             \
    WARN("skipped: " << ddp_skip_reason.str());                                              \
    return;                                                                                  \
  } while (false)
