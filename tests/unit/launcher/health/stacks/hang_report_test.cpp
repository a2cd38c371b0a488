// Tests of hang_report.hpp: the console block names the suspect's rank, node, local rank, pid
// and stack before the others; the JSON carries everything; the error-file paragraph and the
// straggler line.
#include "ddp/launch/hang_report.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sstream>

using namespace ddp::launch;

namespace {

RankStack rank_in(int rank, const std::string& node, std::vector<Frame> innermost_first,
                  std::int64_t step) {
  RankStack r;
  r.rank = rank;
  r.local_rank = rank % 2;
  r.node = node;
  r.pid = 4000 + rank;
  r.step = step;
  r.stacks.pid = r.pid;
  r.stacks.tool = "py-spy";
  r.stacks.threads.push_back({"MainThread", true, std::move(innermost_first)});
  return r;
}

// The gloo script of the research note: rank 1 sleeps in train_step, the others wait in
// all_reduce; rank 3's stack could not be taken.
HangFinding gloo_hang() {
  const std::vector<Frame> waiting{
      {"all_reduce", "torch/distributed/distributed_c10d.py", 4181},
      {"_exception_logger.<locals>.wrapper", "torch/distributed/c10d_logger.py", 83},
      {"train_step", "g.py", 12},
      {"<module>", "g.py", 14}};
  HangFinding f;
  f.kind = "hang";
  f.waited_s = 62.4;
  f.timeout_s = 60;
  f.action = "stop";
  f.ranks = {rank_in(0, "n0", waiting, 3),
             rank_in(1, "n0", {{"train_step", "g.py", 11}, {"<module>", "g.py", 14}}, 3),
             rank_in(2, "n1", waiting, 3)};
  RankStack missing;
  missing.rank = 3;
  missing.local_rank = 1;
  missing.node = "n1";
  missing.pid = 4003;
  missing.stacks.pid = 4003;
  missing.stacks.error = "py-spy: timed out after 5000 ms; eu-stack: not found on PATH";
  f.ranks.push_back(missing);
  f.groups = merge_stacks(f.ranks);
  return f;
}

std::size_t line_of(const std::string& text, const std::string& needle) {
  std::istringstream in(text);
  std::size_t n = 0;
  for (std::string line; std::getline(in, line); ++n) {
    if (line.find(needle) != std::string::npos) return n;
  }
  return std::string::npos;
}

}  // namespace

TEST_CASE("format_hang: the suspect with node, local rank, pid and stack first",
          "[launch][hang_report]") {
  const std::string text = format_hang(gloo_hang());
  INFO(text);
  CHECK(text.rfind(
            std::string(60, '=') + "\nddprun: hang: no progress for 62 s (--hang-timeout=60)\n",
            0) == 0);
  CHECK(text.find("Suspect (smallest group first):") != std::string::npos);
  CHECK(text.find("ranks 1 (node n0 local_rank 1 pid 4001, step 3)") != std::string::npos);
  CHECK(text.find("stack of rank 1 (py-spy, main thread, outermost first)") != std::string::npos);
  // Outermost first: <module> above train_step.
  CHECK(line_of(text, "<module> (g.py:14)") + 1 == line_of(text, "train_step (g.py:11)"));
  CHECK(line_of(text, "train_step (g.py:11)") < line_of(text, "Other groups:"));
  // The others, in one line each, innermost first.
  CHECK(text.find("ranks 0,2 (2 ranks), in a collective, innermost: all_reduce "
                  "(torch/distributed/distributed_c10d.py:4181) < "
                  "_exception_logger.<locals>.wrapper (torch/distributed/c10d_logger.py:83) < "
                  "train_step (g.py:12)") != std::string::npos);
  CHECK(text.find("ranks 3: no stack") != std::string::npos);
  CHECK(text.find("Stacks not taken:\n  rank 3 (node n1, pid 4003): py-spy: timed out after "
                  "5000 ms; eu-stack: not found on PATH") != std::string::npos);
  CHECK(text.find("Action: stop (--on-hang=stop)") != std::string::npos);
  CHECK(text.size() > 60);
  CHECK(text.substr(text.size() - 61) == std::string(60, '=') + "\n");
}

TEST_CASE("format_hang: a timer, a group of several suspects, nothing taken",
          "[launch][hang_report]") {
  HangFinding f = gloo_hang();
  f.kind = "timer";
  f.timer_scope = "step";
  f.action = "report";
  std::string text = format_hang(f);
  CHECK(text.find("ddprun: hang: torch file timer expired (scope step)\n") != std::string::npos);
  CHECK(text.find("Action: report (--on-hang=report): the job goes on") != std::string::npos);

  f = gloo_hang();
  f.ranks.erase(f.ranks.begin() + 1);  // ranks 0 and 2 alone, with 3 missing
  f.groups = merge_stacks(f.ranks);
  text = format_hang(f);
  INFO(text);
  CHECK(text.find("ranks 0,2 (2 ranks):\n    rank 0 (node n0 local_rank 0 pid 4000, step 3)\n"
                  "    rank 2 (node n1 local_rank 0 pid 4002, step 3)\n") != std::string::npos);
  CHECK(text.find("in a collective):\n    <module> (g.py:14)") != std::string::npos);

  HangFinding none;
  none.kind = "hang";
  none.waited_s = 5;
  text = format_hang(none);
  CHECK(text.find("no progress for 5.00 s\n") != std::string::npos);
  CHECK(text.find("No rank's stack arrived.") != std::string::npos);
}

TEST_CASE("format_hang: native frames without a symbol left out, long names cut",
          "[launch][hang_report]") {
  HangFinding f;
  f.kind = "hang";
  f.waited_s = 20;
  const std::string templ = "pybind11::cpp_function::initialize<" + std::string(300, 'x') + ">";
  f.ranks = {rank_in(
      0, "n0", {{"clock_nanosleep", "", 0}, {"??", "", 0}, {templ, "", 0}, {"main", "", 0}}, -1)};
  f.ranks[0].stacks.tool = "eu-stack";
  const std::string text = format_hang(f);
  INFO(text);
  CHECK(text.find("??") == std::string::npos);
  CHECK(line_of(text, "    main") + 1 == line_of(text, "    pybind11::cpp_function::initialize<"));
  CHECK(line_of(text, "xxx...") + 1 == line_of(text, "    clock_nanosleep"));
  CHECK(text.find(std::string(120, 'x')) == std::string::npos);
  CHECK(hang_json(f).find(templ) != std::string::npos);  // the JSON keeps the whole name
}

TEST_CASE("hang_json: groups, suspect, every rank's stacks", "[launch][hang_report]") {
  const auto j = nlohmann::json::parse(hang_json(gloo_hang()));
  CHECK(j["kind"] == "hang");
  CHECK(j["action"] == "stop");
  CHECK(j["waited_s"].get<double>() == Approx(62.4));
  CHECK(j["hang_timeout_s"].get<double>() == Approx(60));
  CHECK(j["suspect_ranks"] == nlohmann::json::array({1}));
  REQUIRE(j["groups"].size() == 3);
  CHECK(j["groups"][1]["ranks_text"] == "0,2");
  CHECK(j["groups"][1]["in_collective"] == true);
  REQUIRE(j["groups"][0]["signature"].size() == 2);
  CHECK(j["groups"][0]["signature"][0].get<std::string>().rfind("<module>", 0) == 0);
  CHECK(j["groups"][0]["signature"][1].get<std::string>().rfind("train_step", 0) == 0);
  CHECK(j["groups"][2]["has_stack"] == false);
  REQUIRE(j["ranks"].size() == 4);
  CHECK(j["ranks"][1]["node"] == "n0");
  CHECK(j["ranks"][1]["pid"] == 4001);
  CHECK(j["ranks"][1]["threads"][0]["frames"][0]["function"] == "train_step");
  CHECK(j["ranks"][1]["threads"][0]["frames"][0]["line"] == 11);
  CHECK(j["ranks"][3]["error"].get<std::string>().find("timed out") != std::string::npos);
  REQUIRE(j["not_taken"].size() == 1);
}

TEST_CASE("hang_error_message: one paragraph naming the suspect", "[launch][hang_report]") {
  const std::string m = hang_error_message(gloo_hang());
  INFO(m);
  CHECK(m.find('\n') == std::string::npos);
  CHECK(m.find("no progress for 62 s") != std::string::npos);
  CHECK(m.find("Suspect rank 1 (node n0, local rank 1, pid 4001) is in train_step (g.py:11), "
               "outside any collective.") != std::string::npos);
  CHECK(m.find("ranks 0,2 are in all_reduce") != std::string::npos);
  CHECK(m.find("Action: stop.") != std::string::npos);

  HangFinding none;
  none.kind = "hang";
  none.waited_s = 30;
  CHECK(hang_error_message(none).find("no rank is named") != std::string::npos);
}

TEST_CASE("format_straggler and stragglers_json", "[launch][hang_report]") {
  const StragglerFinding s{3, 1, "n2", 0.31, 0.10, 12};
  CHECK(format_straggler(s) ==
        "ddprun: straggler: rank 3 (node n2, local rank 1) takes 0.31 s per step, 3.1x the "
        "job's median 0.10 s (over 12 steps)");
  CHECK(format_straggler({0, 0, "a", 0.0042, 0.0014, 5}) ==
        "ddprun: straggler: rank 0 (node a, local rank 0) takes 4.2 ms per step, 3.0x the job's "
        "median 1.4 ms (over 5 steps)");
  const auto j = nlohmann::json::parse(stragglers_json({s}));
  REQUIRE(j["stragglers"].size() == 1);
  CHECK(j["stragglers"][0]["rank"] == 3);
  CHECK(j["stragglers"][0]["node"] == "n2");
  CHECK(j["stragglers"][0]["ratio"].get<double>() == Approx(3.1));
  CHECK(j["stragglers"][0]["steps"] == 12);
  CHECK(nlohmann::json::parse(stragglers_json({}))["stragglers"].empty());
}
