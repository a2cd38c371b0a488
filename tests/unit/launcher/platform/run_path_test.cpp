// Tests of run_path.hpp: --run-path runs `python -u -c <bootstrap> script args` (PYTHON_EXEC,
// ${local_rank} and --module as for any script), and the bootstrap does what torch's
// run_script_path under record() does, without torch. What it does when run is checked side
// by side with torchrun in tests/interop/test_parity_failures.py.
#include <catch2/catch.hpp>

#include "ddp/launch/run_path.hpp"
#include "ddp/launch/worker_env.hpp"
#include "support/launch_config.hpp"

using namespace ddp::launch;

namespace {

LaunchConfig config(std::vector<std::string> args) {
  return ddp::test::parsed_config(std::move(args));
}

}  // namespace

TEST_CASE("flag --run-path runs the script through the bootstrap", "[unit][launch]") {
  auto c = config({"--run-path", "/abs/train_${local_rank}.py", "--lr", "$local_rank"});
  CHECK(worker_argv(c, 2, {}) == std::vector<std::string>{"python3", "-u", "-c",
                                                          run_path_bootstrap(), "/abs/train_2.py",
                                                          "--lr", "2"});
  CHECK(worker_argv(c, 0, {{"PYTHON_EXEC", "/venv/bin/python"}}).front() == "/venv/bin/python");
  // It takes precedence over --no-python and --module, as torchrun's.
  for (const char* flag : {"--no-python", "-m"}) {
    CHECK(worker_argv(config({"--run-path", flag, "/abs/t.py"}), 0, {}) ==
          std::vector<std::string>{"python3", "-u", "-c", run_path_bootstrap(), "/abs/t.py"});
  }
}

TEST_CASE("the bootstrap is torch's run_script_path under record(), without torch",
          "[unit][launch]") {
  const std::string& b = run_path_bootstrap();
  CHECK_THAT(b, Catch::Contains("sys.argv = sys.argv[1:]"));
  CHECK_THAT(b, Catch::Contains("runpy.run_path(sys.argv[0], run_name=\"__main__\")"));
  CHECK_THAT(b, Catch::Contains("sys.path[0] = os.path.dirname(sys.executable)"));
  CHECK_THAT(b, Catch::Contains("faulthandler.enable(all_threads=True)"));
  // record_exception's JSON, field for field.
  CHECK_THAT(b, Catch::Contains("os.environ.get(\"TORCHELASTIC_ERROR_FILE\")"));
  CHECK_THAT(b, Catch::Contains("{\"message\": {\"message\": f\"{type(e).__name__}: {e}\""));
  CHECK_THAT(b, Catch::Contains("\"py_callstack\": traceback.format_exc()"));
  CHECK_THAT(b, Catch::Contains("\"timestamp\": str(int(time.time()))"));
  // Only Exception is recorded (SystemExit and KeyboardInterrupt pass), then re-raised: the
  // traceback reaches stderr and the exit code is 1.
  CHECK_THAT(b, Catch::Contains("except Exception as e:"));
  CHECK_THAT(b, Catch::Contains("        raise\n"));
  CHECK(b.find("torch") == std::string::npos);  // no import of torch
}
