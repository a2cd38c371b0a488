// DCGM's job mapping files (gpu_job_mapping.hpp): the line edits, pure; then the files in a
// private temporary folder: added while the mapping lives, other jobs' lines kept, empty files
// removed, bad folders and job ids refused by name.
#include "ddp/launch/gpu_job_mapping.hpp"

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ddp/proto/error.hpp"

using ddp::launch::GpuJobMapping;
using ddp::launch::with_job;
using ddp::launch::without_job;

namespace {
std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}
}  // namespace

TEST_CASE("job mapping lines: added once, removed whole, others kept", "[gpu_job_mapping]") {
  CHECK(with_job("", "42") == "42\n");
  CHECK(with_job("7\n", "42") == "7\n42\n");
  CHECK(with_job("7\n42\n", "42") == "7\n42\n");
  CHECK(with_job("7", "42") == "7\n42\n");  // a last line without its newline
  CHECK(without_job("7\n42\n", "42") == "7\n");
  CHECK(without_job("42\n", "42").empty());
  CHECK(without_job("421\n", "42") == "421\n");  // lines, not substrings
}

TEST_CASE("job mapping files: the job's GPUs while it runs, nothing after", "[gpu_job_mapping]") {
  char tmpl[] = "/tmp/ddp-dcgm-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::filesystem::path dir = tmpl;
  { std::ofstream(dir / "1") << "other-job\n"; }
  {
    GpuJobMapping m(dir.string(), "1234", {0, 1, -1, 1});
    CHECK(m.files().size() == 2);
    CHECK(slurp(dir / "0") == "1234\n");
    CHECK(slurp(dir / "1") == "other-job\n1234\n");
    CHECK(!std::filesystem::exists(dir / "-1"));
    {
      GpuJobMapping second(dir.string(), "99", {0});
      CHECK(slurp(dir / "0") == "1234\n99\n");
    }
    CHECK(slurp(dir / "0") == "1234\n");
  }
  CHECK(!std::filesystem::exists(dir / "0"));
  CHECK(slurp(dir / "1") == "other-job\n");
  auto refused = [&](const std::string& d, const std::string& job, const std::string& says) {
    try {
      GpuJobMapping bad(d, job, {0});
      FAIL("accepted");
    } catch (const ddp::ConfigError& e) {
      CHECK_THAT(e.what(), Catch::Matchers::Contains("--gpu-job-mapping-dir"));
      CHECK_THAT(e.what(), Catch::Matchers::Contains(says));
    }
  };
  refused((dir / "nope").string(), "1", "not a folder");
  refused((dir / "1").string(), "1", "not a folder");
  refused(dir.string(), "a\nb", "one line");
  refused(dir.string(), std::string(300, 'x'), "one line");
  std::filesystem::remove_all(dir);
}
