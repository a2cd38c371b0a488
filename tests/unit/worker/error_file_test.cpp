// A worker's error file, written in torchrun's @record format, is read back by the agent's own
// reader (the one that prints the failure summary): message, traceback and timestamp survive.
#include "ddp/worker/error_file.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>

#include "ddp/launch/failure_report.hpp"

namespace fs = std::filesystem;

TEST_CASE("the agent reads what a worker reports", "[unit][worker]") {
  auto dir = fs::temp_directory_path() / ("ddp_errfile_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto path = (dir / "error.json").string();
  REQUIRE(ddp::worker::write_error_file(path, "ConfigError", "WORLD_SIZE is not set",
                                        "at read_worker_env\nat main"));
  auto read = ddp::launch::read_error_file(path);
  REQUIRE(read.has_value());
  CHECK(read->message == "ConfigError: WORLD_SIZE is not set");
  CHECK(read->traceback == "at read_worker_env\nat main");
  REQUIRE(read->timestamp.has_value());
  auto now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  CHECK(*read->timestamp <= now);
  CHECK(*read->timestamp > now - 60);
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}) == 1);  // no tmp
  fs::remove_all(dir);
}

TEST_CASE("an unwritable or empty path never throws", "[unit][worker]") {
  CHECK(ddp::worker::write_error_file("", "E", "w", "t"));
  CHECK_FALSE(ddp::worker::write_error_file("/nonexistent-dir/x/error.json", "E", "w", "t"));
}
