// The skip report behind DDP_SKIP (skip.hpp): stdout for ctest's SKIP_REGULAR_EXPRESSION, and one
// JSON line in DDP_TEST_REPORT for scripts/count_tests.py, which lists every skip with its reason.
#include "support/skip.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

namespace ddp::test {
namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::vector<SkippedCase>& skips() {
  static std::vector<SkippedCase> all;
  return all;
}

}  // namespace

const std::vector<SkippedCase>& skipped_cases() { return skips(); }

void note_skip(const std::string& reason) {
  std::cout << "DDP_SKIPPED: " << reason << std::endl;
  skips().push_back({Catch::getResultCapture().getCurrentTestName(), reason});
  const char* path = std::getenv("DDP_TEST_REPORT");
  if (path == nullptr || *path == '\0') return;
  // A case of a ctest entry per case (unit/, integration/) is counted by ctest; one of a suite
  // run whole (the GPU tests, DDP_SUITE) by scripts/count_tests.py from this line.
  const char* suite = std::getenv("DDP_SUITE");
  std::ofstream report(path, std::ios::app);
  report << "{\"suite\": " << json_string(suite != nullptr ? suite : "catch2")
         << ", \"test\": " << json_string(Catch::getResultCapture().getCurrentTestName())
         << ", \"reason\": " << json_string(reason) << "}\n";
}

void note_suite_skip(const std::string& reason) {
  std::cout << "DDP_SKIPPED: " << reason << std::endl;
  const char* path = std::getenv("DDP_TEST_REPORT");
  if (path == nullptr || *path == '\0') return;
  const char* suite = std::getenv("DDP_SUITE");
  std::ofstream report(path, std::ios::app);
  report << "{\"suite\": " << json_string(suite != nullptr ? suite : "catch2")
         << ", \"test\": \"(the whole suite)\", \"reason\": " << json_string(reason) << "}\n";
}

bool tools_required() {
  const char* v = std::getenv("DDP_REQUIRE_TOOLS");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace ddp::test
