// Worker argv and environment against torchrun 2.x's contract (torch-compat.md §2), including
// the values observed from a real torchrun run there.
#include "ddp/launch/worker_env.hpp"

#include <catch2/catch.hpp>

#include "../../support/group_info.hpp"

using namespace ddp::launch;

namespace {

LaunchConfig config(std::vector<std::string> args) {
  args.insert(args.begin(), "ddprun");
  auto r = parse_launch_args(args, {});
  REQUIRE(r.config.has_value());
  return *r.config;
}

GroupInfo two_nodes_second() { return ddp::test::second_of_two_nodes("node0", 41234, "job1"); }

}  // namespace

TEST_CASE("python scripts run under python -u, modules with -m, ${local_rank} substituted",
          "[unit][launch]") {
  auto c = config({"train.py", "--out=/tmp/r${local_rank}", "--x"});
  CHECK(worker_argv(c, 3, {}) ==
        std::vector<std::string>{"python3", "-u", "train.py", "--out=/tmp/r3", "--x"});
  CHECK(worker_argv(c, 0, {{"PYTHON_EXEC", "/venv/bin/python"}}).front() == "/venv/bin/python");
  auto m = config({"-m", "pkg.main", "a"});
  CHECK(worker_argv(m, 0, {}) == std::vector<std::string>{"python3", "-u", "-m", "pkg.main", "a"});
  auto n = config({"--no-python", "/bin/echo", "${local_rank}${local_rank}"});
  // Without braces too, as torchrun (string.Template): "$local_rank" is substituted, a longer
  // name ("$local_rankx") or an unknown one is left as written, and "$$" stays "$$" (a
  // shell's PID; torchrun would make it "$").
  CHECK(worker_argv(config({"--no-python", "/bin/echo", "r$local_rank", "kill $$", "$local_rankx",
                            "$HOME"}),
                    3, {}) ==
        std::vector<std::string>{"/bin/echo", "r3", "kill $$", "$local_rankx", "$HOME"});
  CHECK(worker_argv(n, 1, {}) == std::vector<std::string>{"/bin/echo", "11"});
}

TEST_CASE("a compiled program is recognised (run without python); scripts are not",
          "[unit][launch]") {
  CHECK(is_native_executable("/proc/self/exe"));
  CHECK_FALSE(is_native_executable("/proc/self/status"));  // text
  CHECK_FALSE(is_native_executable("/nonexistent/ddp-train"));
  CHECK_FALSE(is_native_executable("/dev/null"));  // shorter than the magic
}

TEST_CASE("a bare program name is found on PATH as exec finds it", "[unit][launch]") {
  CHECK(find_on_path("sh", "/nonexistent:/bin:/usr/bin") == "/bin/sh");
  CHECK(find_on_path("sh", "/usr/bin:/bin") == "/usr/bin/sh");
  CHECK(find_on_path("no-such-program-ddp", "/bin:/usr/bin").empty());
  CHECK(find_on_path("./sh", "/bin").empty());  // a path is not looked up
  CHECK(find_on_path("bin", "/").empty());      // a folder is not a program
  CHECK(find_on_path("sh", "") == "/bin/sh");   // exec's default path
  CHECK(find_on_path("no-such-program-ddp", "").empty());
}

TEST_CASE("the environment torchrun 2.x exports, on top of the agent's", "[unit][launch]") {
  auto c = config({"--max-restarts=3", "--role=trainer", "x.py"});
  auto env = worker_env(c, two_nodes_second(), 2, {{"PATH", "/bin"}, {"RANK", "stale"}});
  CHECK(env.at("PATH") == "/bin");
  CHECK(env.at("LOCAL_RANK") == "2");
  CHECK(env.at("RANK") == "6");
  CHECK(env.at("GROUP_RANK") == "1");
  CHECK(env.at("ROLE_RANK") == "6");
  CHECK(env.at("ROLE_NAME") == "trainer");
  CHECK(env.at("LOCAL_WORLD_SIZE") == "4");
  CHECK(env.at("WORLD_SIZE") == "8");
  CHECK(env.at("GROUP_WORLD_SIZE") == "2");
  CHECK(env.at("ROLE_WORLD_SIZE") == "8");
  CHECK(env.at("MASTER_ADDR") == "node0");
  CHECK(env.at("MASTER_PORT") == "41234");
  CHECK(env.at("TORCHELASTIC_RESTART_COUNT") == "2");
  CHECK(env.at("TORCHELASTIC_MAX_RESTARTS") == "3");
  CHECK(env.at("TORCHELASTIC_RUN_ID") == "job1");
  CHECK(env.at("TORCHELASTIC_USE_AGENT_STORE") == "True");
  CHECK(env.at("TORCHELASTIC_ERROR_FILE") == "/logs/job1_x/attempt_2/2/error.json");
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "1");
  CHECK(env.at("OMP_NUM_THREADS") == "1");
}

TEST_CASE("inherited NCCL and OpenMP settings are kept; one worker gets no OMP default",
          "[unit][launch]") {
  auto c = config({"x.py"});
  GroupInfo g;
  g.local_world_size = 1;
  auto env = worker_env(c, g, 0, {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"}});
  CHECK(env.at("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0");
  CHECK(env.count("OMP_NUM_THREADS") == 0);
  CHECK(env.at("TORCHELASTIC_ERROR_FILE").empty());
  g.local_world_size = 2;
  CHECK(worker_env(c, g, 1, {{"OMP_NUM_THREADS", "8"}}).at("OMP_NUM_THREADS") == "8");
}
