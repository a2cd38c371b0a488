// Knobs are declared once: every environment variable the sources read is in the registry,
// the registry and docs/env_vars.md list the same names, typed reads refuse bad values, and
// the one number parser has one error shape.
#include <catch2/catch.hpp>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "ddp/proto/error.hpp"
#include "ddp/proto/knobs.hpp"
#include "ddp/proto/number.hpp"

namespace fs = std::filesystem;
using namespace ddp;

namespace {
std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool is_declared(const std::string& name) {
  try {
    (void)knobs::declared(name);
    return true;
  } catch (const std::logic_error&) {
    return false;
  }
}

// The UPPER_CASE names in backticks in `text` ("PET_<FLAG>" -> "PET_*").
std::vector<std::string> backticked_names(const std::string& text) {
  std::vector<std::string> out;
  for (std::size_t at = text.find('`'); at != std::string::npos; at = text.find('`', at + 1)) {
    const auto end = text.find('`', at + 1);
    if (end == std::string::npos) break;
    std::string name = text.substr(at + 1, end - at - 1);
    at = end;
    if (auto lt = name.find('<'); lt != std::string::npos && name.back() == '>') {
      name = name.substr(0, lt) + "*";
    }
    const bool upper =
        !name.empty() && std::isupper(static_cast<unsigned char>(name[0])) &&
        name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_*") == std::string::npos;
    if (upper) out.push_back(name);
  }
  return out;
}

// Names in the first column of docs/env_vars.md rows read by a binary.
std::set<std::string> documented_for_binaries() {
  std::set<std::string> out;
  std::istringstream doc(slurp(fs::path(DDP_SOURCE_DIR) / "docs/env_vars.md"));
  const char* binaries[] = {"every binary", "`ddprun`",   "`ddprund`",
                            "`ddp-train`",  "`ddpstore`", "`ddp_allreduce_bench`"};
  for (std::string line; std::getline(doc, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    auto second = line.find(" | ", 2);
    auto third = line.find(" | ", second + 3);
    if (second == std::string::npos || third == std::string::npos) continue;
    const std::string readers = line.substr(second, third - second);
    bool by_binary = false;
    for (const char* b : binaries) by_binary = by_binary || readers.find(b) != std::string::npos;
    if (!by_binary) continue;
    for (const auto& n : backticked_names(line.substr(0, second))) out.insert(n);
  }
  return out;
}

// The quoted names in calls that read the environment: getenv("X"), env.find("X"),
// env.count("X"), agent_env.find/count("X"), knobs::...("X").
std::vector<std::string> reads_in(const std::string& text) {
  std::vector<std::string> out;
  const char* calls[] = {"getenv(\"",       "env.find(\"",       "env.count(\"",
                         "knobs::text(\"",  "knobs::integer(\"", "knobs::seconds(\"",
                         "knobs::flag01(\""};
  for (const char* call : calls) {
    const std::string c = call;
    for (auto at = text.find(c); at != std::string::npos; at = text.find(c, at + 1)) {
      const auto begin = at + c.size();
      const auto end = text.find('"', begin);
      const std::string name = text.substr(begin, end - begin);
      if (!name.empty() && std::isupper(static_cast<unsigned char>(name[0]))) out.push_back(name);
    }
  }
  return out;
}
}  // namespace

TEST_CASE("every variable the sources read is declared once", "[unit][knobs]") {
  int reads = 0;
  for (const char* dir : {"launcher", "rendezvous", "worker_runtime", "proto", "kernels"}) {
    for (const auto& e : fs::recursive_directory_iterator(fs::path(DDP_SOURCE_DIR) / dir)) {
      const auto ext = e.path().extension();
      if (ext != ".cpp" && ext != ".hpp" && ext != ".cu") continue;
      for (const auto& name : reads_in(slurp(e.path()))) {
        ++reads;
        INFO(e.path().string() << " reads " << name);
        CHECK(is_declared(name));
      }
    }
  }
  CHECK(reads > 5);
}

TEST_CASE("the registry and docs/env_vars.md list the same variables", "[unit][knobs]") {
  const auto doc = documented_for_binaries();
  for (const auto& name : doc) {
    INFO("docs/env_vars.md lists " << name << " for a binary");
    CHECK(is_declared(name));
  }
  for (const auto& k : knobs::all()) {
    std::istringstream names{std::string(k.name)};
    for (std::string n; names >> n;) {
      INFO("declared but not in docs/env_vars.md: " << n);
      const bool family = n.back() == '*';
      bool found = doc.count(n) > 0;
      for (const auto& d : doc) {
        if (family && d.rfind(n.substr(0, n.size() - 1), 0) == 0) found = true;
      }
      CHECK(found);
    }
  }
}

TEST_CASE("typed knob reads take the declared default and refuse bad values", "[unit][knobs]") {
  knobs::Env env;
  CHECK(knobs::flag01("DDP_SHM_ALLREDUCE", &env));
  CHECK(knobs::seconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", &env) == 30.0);
  env["DDP_SHM_ALLREDUCE"] = "0";
  env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "2.5";
  CHECK_FALSE(knobs::flag01("DDP_SHM_ALLREDUCE", &env));
  CHECK(knobs::seconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", &env) == 2.5);
  env["DDP_SHM_ALLREDUCE"] = "yes";
  CHECK_THROWS_WITH(knobs::flag01("DDP_SHM_ALLREDUCE", &env),
                    Catch::Contains("DDP_SHM_ALLREDUCE='yes' must be 0 or 1"));
  env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "-1";
  CHECK_THROWS_AS(knobs::seconds("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", &env), ConfigError);
  CHECK(knobs::text("SLURM_JOB_ID", &env) == std::nullopt);  // a declared family
  CHECK_THROWS_AS(knobs::text("NOT_DECLARED_ANYWHERE", &env), std::logic_error);
}

TEST_CASE("the one number parser: whole text, range, one message shape", "[unit][knobs]") {
  CHECK(parse_int("42", "--x", 0, 100) == 42);
  CHECK(parse_int("-3", "--x", -5, 5) == -3);
  CHECK_THROWS_WITH(parse_int("4x", "--x", 0, 100), "--x '4x' is not an integer");
  CHECK_THROWS_WITH(parse_int("", "--x", 0, 100), "--x '' is not an integer");
  CHECK_THROWS_WITH(parse_int("101", "--x", 0, 100), "--x '101' is out of range [0, 100]");
  CHECK_THROWS_WITH(parse_int("99999999999999999999", "--x", 0, 100),
                    "--x '99999999999999999999' is out of range [0, 100]");
  CHECK(parse_seconds("1.5", "T").count() == 1500);
  CHECK_THROWS_WITH(parse_seconds("inf", "T"), "T 'inf' is not a number of seconds in [0, 604800]");
  CHECK_THROWS_WITH(parse_seconds("1e9", "T", 0, 10),
                    "T '1e9' is not a number of seconds in [0, 10]");
}
