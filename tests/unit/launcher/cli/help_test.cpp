// ddprun --help: every flag with its default, grouped as torchrun groups them; docs/launcher.md's
// flag table is the one cli_flags.cpp makes (regenerate it with `ddprun --help-markdown`).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "ddp/launch/cli_flags.hpp"
#include "ddp/launch/config.hpp"

using namespace ddp::launch;

TEST_CASE("flag --help names every flag, its default and its group", "[unit][launch]") {
  auto r = parse_launch_args({"ddprun", "--help"}, {});
  REQUIRE(r.exit_code == 0);
  const std::string& h = r.message;
  CHECK(h == help_text());
  std::set<FlagGroup> groups;
  for (const auto& s : flag_specs()) {
    INFO(s.dest);
    CHECK(h.find(spelled_names(s)) != std::string::npos);
    CHECK(h.find(std::string("Default: ") + s.fallback) != std::string::npos);
    groups.insert(s.group);
  }
  for (auto g : groups) CHECK(h.find(std::string(group_title(g)) + ":\n") != std::string::npos);
  // torchrun's groups come in torchrun's order.
  CHECK(h.find("Worker/node size:") < h.find("Rendezvous:"));
  CHECK(h.find("Rendezvous:") < h.find("User-code launch:"));
  CHECK(h.find("User-code launch:") < h.find("Shell completion:"));
}

TEST_CASE("every flag the table names is one the parser takes, in both spellings",
          "[unit][launch]") {
  for (const auto& s : flag_specs()) {
    std::string names = s.names;
    std::stringstream in(names);
    std::string n;
    while (std::getline(in, n, ',')) {
      INFO(n);
      std::vector<std::string> argv = {"ddprun", n};
      if (!s.is_switch) {
        std::string v = "1";
        if (std::string(s.dest) == "numa_binding") v = "node";
        if (std::string(s.dest) == "start_method") v = "fork";
        if (std::string(s.dest) == "rdzv_backend") v = "c10d";
        if (std::string(s.dest) == "print_completion") v = "bash";
        if (std::string(s.dest) == "rdzv_conf") v = "join_timeout=5";
        if (std::string(s.dest) == "signals_to_handle") v = "SIGTERM";
        if (std::string(s.dest) == "logs_specs") continue;
        if (std::string(s.dest) == "on_hang") v = "stop";
        if (std::string(s.dest) == "straggler_factor") v = "2";  // always an error (cli_test)
        if (std::string(s.dest) == "progress") v = "lines";
        if (std::string(s.dest) == "store_allow") v = "10.0.0.0/8";
        argv.push_back(v);
      }
      argv.push_back("--rdzv-endpoint=h:1");
      argv.push_back("--rdzv-backend=c10d");
      argv.push_back("x.py");
      auto r = parse_launch_args(argv, {});
      CHECK(r.exit_code == 0);
      if (r.exit_code != 0) FAIL(r.message);
    }
  }
}

TEST_CASE("docs/launcher.md's flag table is the table ddprun's --help comes from",
          "[unit][launch]") {
  std::ifstream in(std::string(DDP_SOURCE_DIR) + "/docs/launcher.md");
  REQUIRE(in);
  std::stringstream doc;
  doc << in.rdbuf();
  const std::string table = markdown_flag_table();
  INFO("regenerate: build/bin/ddprun --help-markdown, between the flag-table markers");
  CHECK(doc.str().find("<!-- flag-table: begin -->\n" + table + "<!-- flag-table: end -->") !=
        std::string::npos);
}

TEST_CASE("the bash completion script offers every long flag", "[unit][launch]") {
  const std::string bash = completion_script("bash");
  for (const auto& s : flag_specs()) CHECK(bash.find(long_name(s)) != std::string::npos);
  CHECK(bash.find("complete -o filenames -F _ddprun ddprun") != std::string::npos);
  CHECK_THROWS(completion_script("fish"));
}

// catch_discover_tests splits a name at ';' (a CMake list): each half matched no test, so the
// test never ran and ctest called it passed.
TEST_CASE(
    "no test's name starts with '-' (ctest would hand it to Catch2 as an option) or holds "
    "a semicolon",
    "[unit][launch]") {
  namespace fs = std::filesystem;
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(std::string(DDP_SOURCE_DIR) + "/tests")) {
    if (e.path().extension() != ".cpp") continue;
    ++files;
    std::ifstream in(e.path());
    std::string line;
    while (std::getline(in, line)) {
      INFO(e.path().string() << ": " << line);
      CHECK(line.find("TEST_CASE(\"-") == std::string::npos);
      const auto at = line.find("TEST_CASE(\"");
      if (at != std::string::npos) {
        const auto end = line.find('"', at + 11);
        CHECK(line.substr(at, end == std::string::npos ? std::string::npos : end - at).find(';') ==
              std::string::npos);
      }
    }
  }
  CHECK(files > 20);  // the scan found the test sources
}
