// Worker argv and environment against torchrun 2.x's contract (torch-compat.md §2), including
// the values observed from a real torchrun run there.
#include "ddp/launch/worker_env.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ddp/proto/error.hpp"

#include "support/group_info.hpp"
#include "support/launch_config.hpp"

using namespace ddp::launch;

namespace {

LaunchConfig config(std::vector<std::string> args) {
  return ddp::test::parsed_config(std::move(args));
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

TEST_CASE("a compiled program is recognised (run without python), scripts are not",
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

TEST_CASE("inherited NCCL and OpenMP settings are kept, one worker gets no OMP default",
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

TEST_CASE("flag --virtual-local-rank: LOCAL_RANK=0 and the worker's own entry of the GPU list",
          "[unit][launch]") {
  auto c = config({"x.py"});
  c.virtual_local_rank = true;
  const auto g = two_nodes_second();  // 4 workers a node
  // torchrun's _set_local_rank_env: the parent's CUDA_VISIBLE_DEVICES split on ',', this
  // worker's entry stripped of spaces.
  auto env = worker_env(c, g, 2, {{"CUDA_VISIBLE_DEVICES", "4, 5 ,GPU-abc ,7"}});
  CHECK(env.at("LOCAL_RANK") == "0");
  CHECK(env.at("RANK") == "6");  // everything else as usual
  CHECK(env.at("LOCAL_WORLD_SIZE") == "4");
  CHECK(env.at("TORCHELASTIC_ERROR_FILE") == "/logs/job1_x/attempt_2/2/error.json");
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "GPU-abc");
  CHECK(env.count("HIP_VISIBLE_DEVICES") == 0);
  // Unset: the local rank itself.
  CHECK(worker_env(c, g, 3, {}).at("CUDA_VISIBLE_DEVICES") == "3");
  // Set but empty: one (empty) entry, as Python's "".split(",").
  CHECK(worker_env(c, g, 0, {{"CUDA_VISIBLE_DEVICES", ""}}).at("CUDA_VISIBLE_DEVICES").empty());
  CHECK_THROWS_AS(worker_env(c, g, 1, {{"CUDA_VISIBLE_DEVICES", ""}}), ddp::ConfigError);
  // Too few entries for the local rank: an error naming the variable (torchrun: ValueError).
  CHECK_THROWS_WITH(worker_env(c, g, 2, {{"CUDA_VISIBLE_DEVICES", "0,1"}}),
                    Catch::Contains("local rank 2 has no GPU in CUDA_VISIBLE_DEVICES=0,1"));
  // Without the flag, the inherited list is left alone.
  c.virtual_local_rank = false;
  env = worker_env(c, g, 2, {{"CUDA_VISIBLE_DEVICES", "4,5,6,7"}});
  CHECK(env.at("LOCAL_RANK") == "2");
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "4,5,6,7");
}

TEST_CASE("flag --virtual-local-rank: a non-empty HIP_VISIBLE_DEVICES wins and is written too",
          "[unit][launch]") {
  auto c = config({"x.py"});
  c.virtual_local_rank = true;
  const auto g = two_nodes_second();
  auto env =
      worker_env(c, g, 1, {{"HIP_VISIBLE_DEVICES", "2,3"}, {"CUDA_VISIBLE_DEVICES", "0,1,2,3"}});
  CHECK(env.at("HIP_VISIBLE_DEVICES") == "3");
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "3");
  CHECK_THROWS_WITH(worker_env(c, g, 2, {{"HIP_VISIBLE_DEVICES", "2,3"}}),
                    Catch::Contains("HIP_VISIBLE_DEVICES=2,3"));
  // An empty HIP_VISIBLE_DEVICES does not count (torchrun tests it for truth).
  env = worker_env(c, g, 1, {{"HIP_VISIBLE_DEVICES", ""}, {"CUDA_VISIBLE_DEVICES", "0,1"}});
  CHECK(env.at("CUDA_VISIBLE_DEVICES") == "1");
  CHECK(env.at("HIP_VISIBLE_DEVICES").empty());
}

TEST_CASE("the checks before the rendezvous: a short GPU list, Slurm's flag outside Slurm",
          "[unit][launch]") {
  auto c = config({"x.py"});
  CHECK(check_worker_env_options(c, 4, {{"CUDA_VISIBLE_DEVICES", "0"}}).empty());
  c.virtual_local_rank = true;
  CHECK(check_worker_env_options(c, 2, {{"CUDA_VISIBLE_DEVICES", "0,1"}}).empty());
  CHECK(check_worker_env_options(c, 2, {}).empty());
  CHECK_THROWS_WITH(check_worker_env_options(c, 3, {{"CUDA_VISIBLE_DEVICES", "0,1"}}),
                    Catch::Contains("local rank 2 has no GPU"));
  c.virtual_local_rank = false;
  c.per_worker_slurm_env = true;
  CHECK_THAT(check_worker_env_options(c, 2, {}), Catch::Contains("not inside a Slurm job"));
  CHECK(check_worker_env_options(c, 2, {{"SLURM_JOB_ID", "12"}}).empty());
}

TEST_CASE("flag --per-worker-slurm-env rewrites Slurm's task variables under Slurm only",
          "[unit][launch]") {
  auto c = config({"x.py"});
  const auto g = two_nodes_second();  // node 1 of 2, 4 workers each, ranks 4..7
  const EnvMap slurm = {{"SLURM_JOB_ID", "12"},   {"SLURM_PROCID", "1"},
                        {"SLURM_LOCALID", "0"},   {"SLURM_NODEID", "1"},
                        {"SLURM_NTASKS", "2"},    {"SLURM_JOB_NUM_NODES", "2"},
                        {"SLURM_TASK_PID", "77"}, {"SLURM_STEP_NODELIST", "n[1-2]"}};
  // Off (the default): Slurm's values, as torchrun leaves them.
  CHECK(worker_env(c, g, 2, slurm).at("SLURM_PROCID") == "1");
  c.per_worker_slurm_env = true;
  auto env = worker_env(c, g, 2, slurm);
  CHECK(env.at("SLURM_PROCID") == "6");
  CHECK(env.at("SLURM_LOCALID") == "2");
  CHECK(env.at("SLURM_NODEID") == "1");
  CHECK(env.at("SLURM_NTASKS") == "8");
  CHECK(env.at("SLURM_NTASKS_PER_NODE") == "4");
  CHECK(env.at("SLURM_GTIDS") == "4,5,6,7");
  CHECK(env.at("SLURM_JOB_NUM_NODES") == "2");  // the allocation's, unchanged
  CHECK(env.at("SLURM_TASK_PID") == "77");
  CHECK(env.at("SLURM_STEP_NODELIST") == "n[1-2]");
  // With --virtual-local-rank, SLURM_LOCALID follows the LOCAL_RANK the worker sees.
  c.virtual_local_rank = true;
  CHECK(worker_env(c, g, 2, slurm).at("SLURM_LOCALID") == "0");
  // Outside a Slurm job nothing SLURM_* is added.
  c.virtual_local_rank = false;
  env = worker_env(c, g, 2, {{"PATH", "/bin"}});
  for (const auto& [name, value] : env) CHECK(name.rfind("SLURM_", 0) != 0);
}

TEST_CASE("the workers' python: PYTHON_EXEC, else a wheel's own environment, else PATH's",
          "[worker_env]") {
  using ddp::launch::choose_python;
  char tmpl[] = "/tmp/ddp-py-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string bin = tmpl;
  CHECK(choose_python({}, bin, true).path == "python3");  // nothing beside it: PATH's
  const std::string py = bin + "/python3";
  {
    std::ofstream f(py);
    f << "#!/bin/sh\n";
  }
  REQUIRE(::chmod(py.c_str(), 0755) == 0);
  CHECK(choose_python({}, bin, true).path == py);
  CHECK(choose_python({}, bin, true).why == "the environment ddprun is installed in");
  CHECK(choose_python({}, bin, false).path == "python3");  // built from source: today's rule
  CHECK(choose_python({{"PYTHON_EXEC", "/opt/py"}}, bin, true).path == "/opt/py");
  CHECK(choose_python({{"PYTHON_EXEC", ""}}, bin, true).path == py);
  ddp::launch::LaunchConfig c;
  c.entrypoint = "t.py";
  c.python = py;
  CHECK(ddp::launch::worker_argv(c, 0, {}).front() == py);
  CHECK(ddp::launch::worker_argv(c, 0, {{"PYTHON_EXEC", "/opt/py"}}).front() == "/opt/py");
  std::filesystem::remove_all(bin);
}

TEST_CASE("the workers' python of a repaired wheel: <prefix>/bin beside site-packages",
          "[worker_env]") {
  char tmpl[] = "/tmp/ddp-venv-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::filesystem::path prefix = tmpl;
  const auto scripts = prefix / "lib" / "python3.11" / "site-packages" / "ddprun.scripts";
  std::filesystem::create_directories(scripts);
  std::filesystem::create_directories(prefix / "bin");
  {
    std::ofstream f(prefix / "bin" / "python3");
    f << "#!/bin/sh\n";
  }
  REQUIRE(::chmod((prefix / "bin" / "python3").c_str(), 0755) == 0);
  const auto py = ddp::launch::choose_python({}, scripts.string(), true);
  CHECK(py.path == (prefix / "bin" / "python3").string());
  std::filesystem::remove_all(prefix);
}
