// ddprun's command line against torchrun 2.x's: every flag in both spellings, defaults, PET_*
// environment defaults with the command line winning, and a clear exit-2 message for bad input,
// sanity bounds on every count (limits.hpp, with the machine passed in) included.
#include "ddp/launch/config.hpp"

#include <catch2/catch.hpp>

#include "ddp/launch/limits.hpp"
#include <csignal>

#include "ddp/proto/error.hpp"

using namespace ddp::launch;
using Env = std::map<std::string, std::string>;

namespace {

LaunchConfig ok(std::vector<std::string> args, const Env& env = {}) {
  args.insert(args.begin(), "ddprun");
  auto r = parse_launch_args(args, env);
  INFO(r.message);
  REQUIRE(r.config.has_value());
  return *r.config;
}

std::string bad(std::vector<std::string> args, const Env& env = {}) {
  args.insert(args.begin(), "ddprun");
  auto r = parse_launch_args(args, env);
  REQUIRE_FALSE(r.config.has_value());
  CHECK(r.exit_code == 2);
  return r.message;
}

}  // namespace

TEST_CASE("torchrun's defaults", "[unit][launch]") {
  // torch 2.15: static, no endpoint, no --master-port, one node -> c10d on a free local port
  // with a fresh run id (run.py's run()).
  auto c = ok({"train.py"});
  CHECK(c.min_nodes == 1);
  CHECK(c.max_nodes == 1);
  CHECK(c.nproc_per_node == "1");
  CHECK(c.rdzv_backend == "c10d");
  CHECK(c.private_store);
  CHECK_FALSE(c.standalone);
  CHECK(c.rdzv_id.size() == 36);
  CHECK(c.rdzv_id != ok({"train.py"}).rdzv_id);
  CHECK(c.max_restarts == 0);
  CHECK(c.monitor_interval_s == Approx(0.1));
  CHECK(c.role == "default");
  CHECK(c.master_addr == "127.0.0.1");
  CHECK(c.master_port == 29500);
  CHECK(c.node_rank == 0);
  CHECK(c.signals_to_handle == std::vector<int>{SIGTERM, SIGINT, SIGHUP, SIGQUIT});
  CHECK(c.redirects.for_rank(0) == Std::none);
  CHECK(c.entrypoint == "train.py");
  CHECK(c.args.empty());
  CHECK(c.endpoint().host == "localhost");
  CHECK(c.endpoint().port == 0);
  CHECK(c.shutdown_timeout_s == std::nullopt);
  CHECK(c.numa_binding.empty());
  CHECK_FALSE(c.virtual_local_rank);
  CHECK(c.duplicate_stdout_filters.empty());
  CHECK(c.duplicate_stderr_filters.empty());
  CHECK_FALSE(c.per_worker_slurm_env);
  // Given --master-port (or two nodes, or an endpoint), static stays static on that port.
  auto s = ok({"--master-port=29500", "train.py"});
  CHECK(s.rdzv_backend == "static");
  CHECK(s.rdzv_id == "none");
  CHECK_FALSE(s.private_store);
  CHECK(s.master_port_given);
  CHECK(s.endpoint().host == "127.0.0.1");
  CHECK(s.endpoint().port == 29500);
  CHECK(ok({"--nnodes=2", "train.py"}).rdzv_backend == "static");
  CHECK(ok({"--master-addr=[::1]", "--master-port=5", "x"}).endpoint().host == "::1");
  CHECK(ok({"train.py"}, {{"PET_MASTER_PORT", "29511"}}).rdzv_backend == "static");
}

TEST_CASE("torch 2.12-2.15's flags", "[unit][launch]") {
  CHECK(ok({"--shutdown-timeout=5", "x"}).shutdown_timeout_s == 5);
  CHECK(ok({"--shutdown_timeout", "0", "x"}).shutdown_timeout_s == 0);
  CHECK(ok({"x"}, {{"PET_SHUTDOWN_TIMEOUT", "7"}}).shutdown_timeout_s == 7);
  CHECK(bad({"--shutdown-timeout=1.5", "x"}).find("--shutdown-timeout") != std::string::npos);
  CHECK(bad({"--shutdown-timeout=-1", "x"}).find("--shutdown-timeout") != std::string::npos);
  CHECK(bad({"--shutdown-timeout=99999999", "x"}).find("--shutdown-timeout") != std::string::npos);
  for (const char* mode : {"node", "socket", "exclusive", "core-complex"}) {
    CHECK(ok({std::string("--numa-binding=") + mode, "x"}).numa_binding == mode);
    CHECK(ok({"--numa_binding", mode, "x"}).numa_binding == mode);
  }
  CHECK(bad({"--numa-binding=gpu", "x"}).find("invalid choice 'gpu'") != std::string::npos);
  CHECK(ok({"x"}, {{"PET_NUMA_BINDING", "node"}}).numa_binding.empty());  // no PET_ in torchrun
  CHECK(ok({"--virtual-local-rank", "x"}).virtual_local_rank);
  CHECK(ok({"--virtual_local_rank", "x"}).virtual_local_rank);
  CHECK(ok({"x"}, {{"PET_VIRTUAL_LOCAL_RANK", "1"}}).virtual_local_rank);
  CHECK(ok({"--per-worker-slurm-env", "x"}).per_worker_slurm_env);
  CHECK(ok({"--duplicate-stdout-filters=apple,orange", "x"}).duplicate_stdout_filters ==
        std::vector<std::string>{"apple", "orange"});
  CHECK(ok({"--duplicate_stderr_filters", "a,,b,c", "x"}).duplicate_stderr_filters ==
        std::vector<std::string>{"a,b", "c"});
  CHECK(ok({"x"}, {{"PET_DUPLICATE_STDOUT_FILTERS", "loss"}}).duplicate_stdout_filters ==
        std::vector<std::string>{"loss"});
  // --logs-specs names a Python plugin: torchrun fails on one it cannot find; ddprun can load
  // none, and says so rather than ignoring it.
  CHECK(bad({"--logs-specs", "mine", "x"}).find("torchrun.logs_specs[mine]") != std::string::npos);
  CHECK(bad({"--logs_specs=mine", "x"}).find("--logs-specs") != std::string::npos);
}

TEST_CASE("ddprun's hang and straggler flags", "[unit][launch]") {
  auto d = ok({"x"});
  CHECK(d.hang_timeout_s == Approx(600));
  CHECK(d.on_hang == "report");
  CHECK(d.straggler_factor == Approx(3));
  auto c = ok({"--hang-timeout=2.5", "--on-hang=restart", "--straggler-factor=1.5", "x"});
  CHECK(c.hang_timeout_s == Approx(2.5));
  CHECK(c.on_hang == "restart");
  CHECK(c.straggler_factor == Approx(1.5));
  CHECK(ok({"--hang_timeout", "0", "--straggler_factor", "0", "x"}).hang_timeout_s == 0);
  CHECK(ok({"x"}, {{"PET_ON_HANG", "stop"}}).on_hang == "stop");
  CHECK_THAT(bad({"--hang-timeout=soon", "x"}), Catch::Contains("--hang-timeout"));
  CHECK_THAT(bad({"--hang-timeout=9999999", "x"}), Catch::Contains("--hang-timeout"));
  CHECK_THAT(bad({"--on-hang=panic", "x"}), Catch::Contains("invalid choice 'panic'"));
  CHECK_THAT(bad({"--straggler-factor=0.5", "x"}), Catch::Contains("above 1"));
  CHECK_THAT(bad({"--straggler-factor=x", "x"}), Catch::Contains("--straggler-factor"));
  CHECK_THAT(bad({"--straggler-factor=nan", "x"}), Catch::Contains("--straggler-factor"));
}

TEST_CASE("flag --standalone ignores the rendezvous flags, as torchrun does", "[unit][launch]") {
  auto c = ok({"--standalone", "--rdzv-backend=etcd-v2", "--rdzv-endpoint=not a host:x",
               "--rdzv-id=mine", "x"});
  CHECK(c.rdzv_backend == "c10d");
  CHECK(c.rdzv_endpoint == "localhost:0");
  CHECK(c.rdzv_id != "mine");
  CHECK(c.private_store);
}

TEST_CASE("flag --print-completion prints a script and exits 0 without a training script",
          "[unit][launch]") {
  for (const char* shell : {"bash", "zsh", "tcsh"}) {
    auto r = parse_launch_args({"ddprun", "--print-completion", shell}, {});
    CHECK_FALSE(r.config);
    CHECK(r.exit_code == 0);
    CHECK(r.message.find("ddprun") != std::string::npos);
    CHECK(r.message.find("nproc-per-node") != std::string::npos);
  }
  auto r = parse_launch_args({"ddprun", "--print-completion=fish"}, {});
  CHECK(r.exit_code == 2);
  CHECK(r.message.find("--print-completion") != std::string::npos);
}

TEST_CASE("every multi-word flag has a dashed and an underscored spelling", "[unit][launch]") {
  auto check_both = [](const std::string& dashed, const std::string& value, auto get) {
    std::string under = dashed;
    std::replace(under.begin() + 2, under.end(), '-', '_');
    auto a = ok({dashed + "=" + value, "x.py"});
    auto b = ok({under, value, "x.py"});
    CHECK(get(a) == get(b));
    return get(a);
  };
  CHECK(check_both("--nproc-per-node", "4", [](auto& c) { return c.nproc_per_node; }) == "4");
  CHECK(ok({"--rdzv-backend=c10d", "--rdzv-endpoint=h", "x"}).rdzv_backend == "c10d");
  CHECK(ok({"--rdzv_backend", "c10d", "--rdzv_endpoint", "h", "x"}).rdzv_backend == "c10d");
  CHECK(check_both("--rdzv-endpoint", "h:1", [](auto& c) { return c.rdzv_endpoint; }) == "h:1");
  CHECK(ok({"--rdzv-id=job7", "--nnodes=2", "x"}).rdzv_id == "job7");
  CHECK(ok({"--rdzv_id", "job7", "--nnodes=2", "x"}).rdzv_id == "job7");
  CHECK(check_both("--max-restarts", "3", [](auto& c) { return c.max_restarts; }) == 3);
  CHECK(check_both("--monitor-interval", "0.5", [](auto& c) { return c.monitor_interval_s; }) ==
        Approx(0.5));
  CHECK(check_both("--start-method", "fork", [](auto& c) { return c.start_method; }) == "fork");
  CHECK(check_both("--log-dir", "/tmp/l", [](auto& c) { return c.log_dir; }) == "/tmp/l");
  CHECK(check_both("--node-rank", "2", [](auto& c) { return c.node_rank; }) == 2);
  CHECK(check_both("--master-addr", "10.0.0.9", [](auto& c) { return c.master_addr; }) ==
        "10.0.0.9");
  CHECK(check_both("--master-port", "1234", [](auto& c) { return c.master_port; }) == 1234);
  CHECK(check_both("--local-addr", "n1", [](auto& c) { return c.local_addr; }) == "n1");
  CHECK(check_both("--local-ranks-filter", "0,2", [](auto& c) { return c.local_ranks_filter; }) ==
        std::vector<int>{0, 2});
  CHECK(check_both("--signals-to-handle", "SIGUSR1,SIGTERM", [](auto& c) {
          return c.signals_to_handle;
        }) == std::vector<int>{SIGUSR1, SIGTERM});
  CHECK(check_both("--rdzv-conf", "join_timeout=5,is_host=false", [](auto& c) {
          return c.rdzv_conf;
        }) == std::map<std::string, std::string>{{"is_host", "false"}, {"join_timeout", "5"}});
  CHECK(ok({"--no_python", "x"}).no_python);
  CHECK(ok({"--no-python", "x"}).no_python);
  CHECK(ok({"--run_path", "/x.py"}).run_path);
  CHECK(ok({"--event-log-handler", "console", "x"}).entrypoint == "x");
  CHECK(ok({"--numa-binding", "node", "x"}).entrypoint == "x");
}

TEST_CASE("nnodes takes N or MIN:MAX", "[unit][launch]") {
  auto c = ok({"--nnodes=2", "x.py"});
  CHECK(c.min_nodes == 2);
  CHECK(c.max_nodes == 2);
  c = ok({"--nnodes", "1:4", "x.py"});
  CHECK(c.min_nodes == 1);
  CHECK(c.max_nodes == 4);
  CHECK_THAT(bad({"--nnodes=0", "x.py"}), Catch::Contains("--nnodes"));
  CHECK_THAT(bad({"--nnodes=3:2", "x.py"}), Catch::Contains("MIN <= MAX"));
  CHECK_THAT(bad({"--nnodes=a:b", "x.py"}), Catch::Contains("not an integer"));
  CHECK_THAT(bad({"--nnodes=1:2:3", "x.py"}), Catch::Contains("N or MIN:MAX"));
}

TEST_CASE("nproc-per-node takes an integer, cpu, gpu or auto", "[unit][launch]") {
  for (const char* v : {"8", "cpu", "gpu", "auto"}) {
    CHECK(ok({"--nproc-per-node", v, "x.py"}).nproc_per_node == v);
  }
  CHECK_THAT(bad({"--nproc-per-node=0", "x.py"}), Catch::Contains("--nproc-per-node"));
  CHECK_THAT(bad({"--nproc-per-node=many", "x.py"}), Catch::Contains("--nproc-per-node"));
}

TEST_CASE("the script's own arguments are passed through untouched", "[unit][launch]") {
  auto c = ok({"--nproc-per-node=2", "train.py", "--nproc-per-node", "9", "--lr=0.1",
               "--local-rank=${local_rank}"});
  CHECK(c.nproc_per_node == "2");
  CHECK(c.entrypoint == "train.py");
  CHECK(c.args == std::vector<std::string>{"--nproc-per-node", "9", "--lr=0.1",
                                           "--local-rank=${local_rank}"});
  auto d = ok({"--", "prog", "-x"});
  CHECK(d.entrypoint == "prog");
  CHECK(d.args == std::vector<std::string>{"-x"});
}

TEST_CASE("short flags -m -r -t", "[unit][launch]") {
  auto c = ok({"-m", "-r", "3", "-t", "0:1,1:2", "pkg.mod"});
  CHECK(c.module);
  CHECK(c.redirects.for_rank(5) == Std::all);
  CHECK(c.tee.for_rank(0) == Std::out);
  CHECK(c.tee.for_rank(1) == Std::err);
  CHECK(c.tee.for_rank(2) == Std::none);
  CHECK_THAT(bad({"-r", "4", "x"}), Catch::Contains("--redirects"));
  CHECK_THAT(bad({"-t", "0:9", "x"}), Catch::Contains("--tee"));
  CHECK_THAT(bad({"-t", "a:1", "x"}), Catch::Contains("--tee"));
}

TEST_CASE("PET_* environment supplies defaults and the command line wins", "[unit][launch]") {
  Env env = {{"PET_NNODES", "2:3"},
             {"PET_NPROC_PER_NODE", "4"},
             {"PET_RDZV_ENDPOINT", "store:29401"},
             {"PET_RDZV_BACKEND", "c10d"},
             {"PET_MAX_RESTARTS", "2"},
             {"PET_NO_PYTHON", "1"}};
  auto c = ok({"x"}, env);
  CHECK(c.min_nodes == 2);
  CHECK(c.max_nodes == 3);
  CHECK(c.nproc_per_node == "4");
  CHECK(c.endpoint().host == "store");
  CHECK(c.endpoint().port == 29401);
  CHECK(c.max_restarts == 2);
  CHECK(c.no_python);
  auto d = ok({"--nproc-per-node=8", "--max_restarts", "0", "x"}, env);
  CHECK(d.nproc_per_node == "8");
  CHECK(d.max_restarts == 0);
  CHECK_FALSE(ok({"x"}, {{"PET_STANDALONE", "0"}}).standalone);
  CHECK(ok({"x"}, {{"PET_STANDALONE", "1"}}).standalone);
  CHECK_THAT(bad({"x"}, {{"PET_MAX_RESTARTS", "lots"}}), Catch::Contains("max-restarts"));
}

TEST_CASE("an empty PET_* value is an empty value, not the next argument", "[unit][launch]") {
  auto c = ok({"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=h", "train.py"},
              {{"PET_RDZV_CONF", ""}});
  CHECK(c.max_nodes == 2);
  CHECK(c.rdzv_conf.empty());
  CHECK(c.entrypoint == "train.py");
}

TEST_CASE("standalone picks c10d on a free local port with a fresh run id", "[unit][launch]") {
  auto a = ok({"--standalone", "--rdzv-endpoint=elsewhere:1", "x"});
  auto b = ok({"--standalone", "x"});
  CHECK(a.rdzv_backend == "c10d");
  CHECK(a.endpoint().host == "localhost");
  CHECK(a.endpoint().port == 0);
  CHECK(a.rdzv_id.size() == 36);
  CHECK(a.rdzv_id != b.rdzv_id);  // two standalone jobs on one host never share a store
  CHECK(a.rdzv_id[14] == '4');    // a version 4 UUID, as torchrun's uuid4()
  CHECK(std::string("89ab").find(a.rdzv_id[19]) != std::string::npos);
}

TEST_CASE("the log line prefix: flag, then torchrun's env template, else unset", "[unit][launch]") {
  CHECK_FALSE(ok({"x"}).log_line_prefix_template.has_value());
  Env env{{"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE", "${rank}|"}};
  CHECK(ok({"x"}, env).log_line_prefix_template == "${rank}|");
  CHECK(ok({"--log-line-prefix-template", "", "x"}, env).log_line_prefix_template == "");
  auto empty = ok({"--log-line-prefix-template=", "--standalone", "x"}, env);
  CHECK(empty.log_line_prefix_template == "");
  CHECK(empty.standalone);
  CHECK(ok({"--log_line_prefix_template", "<${host}>", "x"}).log_line_prefix_template ==
        "<${host}>");
}

TEST_CASE("rendezvous endpoints: default ports, IPv6, errors", "[unit][launch]") {
  CHECK(ok({"--rdzv-backend=c10d", "--rdzv-endpoint=node1", "x"}).endpoint().port == 29400);
  auto v6 = ok({"--rdzv-backend=c10d", "--rdzv-endpoint=[::1]:5000", "x"}).endpoint();
  CHECK(v6.host == "::1");
  CHECK(v6.port == 5000);
  CHECK(parse_endpoint("fe80::1", 29400).host == "fe80::1");
  CHECK_THROWS_AS(parse_endpoint("[::1", 1), ddp::ConfigError);
  CHECK_THROWS_AS(parse_endpoint("h:70000", 1), ddp::ConfigError);
  CHECK_THROWS_AS(parse_endpoint(":80", 1), ddp::ConfigError);
  CHECK_THAT(bad({"--rdzv-backend=c10d", "x"}), Catch::Contains("--rdzv-endpoint is required"));
  CHECK_THAT(bad({"--rdzv-backend=c10d", "--rdzv-endpoint=h:x", "x"}),
             Catch::Contains("the port is not a number"));
  CHECK_THAT(bad({"--rdzv-backend=zookeeper", "--rdzv-endpoint=h", "x"}),
             Catch::Contains("--rdzv-backend: 'zookeeper' is not supported"));
}

TEST_CASE("bad input gets exit code 2 and names what was wrong", "[unit][launch]") {
  CHECK_THAT(bad({}), Catch::Contains("training_script"));
  CHECK_THAT(bad({"--bogus", "x"}), Catch::Contains("--bogus"));
  CHECK_THAT(bad({"--max-restarts=-1", "x"}), Catch::Contains("--max-restarts"));
  CHECK_THAT(bad({"--monitor-interval=0", "x"}), Catch::Contains("--monitor-interval"));
  CHECK_THAT(bad({"--master-port=70000", "x"}), Catch::Contains("--master-port"));
  CHECK_THAT(bad({"--start-method=thread", "x"}), Catch::Contains("--start-method"));
  CHECK_THAT(bad({"-m", "--no-python", "x"}), Catch::Contains("--no-python"));
  CHECK_THAT(bad({"--rdzv-conf=novalue", "x"}), Catch::Contains("KEY=VALUE"));
  CHECK_THAT(bad({"--signals-to-handle=SIGKILL", "x"}), Catch::Contains("SIGKILL"));
  CHECK_THAT(bad({"--local-ranks-filter=0,x", "x"}), Catch::Contains("--local-ranks-filter"));
  CHECK_THAT(bad({"--node-rank=-1", "x"}), Catch::Contains("--node-rank"));
}

TEST_CASE("help prints the options and exits 0", "[unit][launch]") {
  auto r = parse_launch_args({"ddprun", "--help"}, {});
  CHECK_FALSE(r.config.has_value());
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.message, Catch::Contains("--nproc-per-node"));
}

TEST_CASE("every count has a sanity bound, and the message names the flag", "[unit][launch]") {
  CHECK_THAT(bad({"--nproc-per-node=10000000", "--no-python", "/bin/true"}),
             Catch::Contains("--nproc-per-node=10000000"));
  CHECK_THAT(bad({"--nproc-per-node=99999999999", "x"}),
             Catch::Contains("--nproc-per-node") && Catch::Contains("out of range"));
  CHECK_THAT(bad({"--nnodes=100000", "--rdzv-backend=c10d", "--rdzv-endpoint=h", "x"}),
             Catch::Contains("--nnodes"));
  CHECK_THAT(bad({"--nnodes=1:100000", "--rdzv-backend=c10d", "--rdzv-endpoint=h", "x"}),
             Catch::Contains("--nnodes"));
  CHECK_THAT(bad({"--node-rank=70000", "x"}), Catch::Contains("--node-rank"));
  CHECK_THAT(bad({"--max-restarts=1000000", "x"}), Catch::Contains("--max-restarts"));
  CHECK_THAT(bad({"--monitor-interval=1e12", "x"}), Catch::Contains("--monitor-interval"));
  CHECK_THAT(bad({"--local-ranks-filter=0,70000", "x"}), Catch::Contains("--local-ranks-filter"));
  CHECK_THAT(bad({"--local-ranks-filter=-1", "x"}), Catch::Contains("--local-ranks-filter"));
  CHECK_THAT(bad({"--redirects=70000:1", "x"}), Catch::Contains("--redirects"));
  CHECK_THAT(bad({"--tee=0:1,100000:2", "x"}), Catch::Contains("--tee"));
  CHECK_THAT(bad({"--rdzv-conf=join_timeout=1e300", "x"}), Catch::Contains("join_timeout"));
  CHECK_THAT(bad({"--rdzv-conf=last_call_timeout=-1", "x"}), Catch::Contains("last_call_timeout"));
  CHECK_THAT(bad({"--rdzv-conf=read_timeout=nan", "x"}), Catch::Contains("read_timeout"));
  CHECK_THAT(bad({"--rdzv-conf=keep_alive_interval=0", "x"}),
             Catch::Contains("keep_alive_interval"));
  CHECK_THAT(bad({"--rdzv-conf=keep_alive_max_attempt=100000", "x"}),
             Catch::Contains("keep_alive_max_attempt"));
  CHECK_THAT(bad({"--max-nproc-per-node=0", "x"}), Catch::Contains("--max-nproc-per-node"));
  CHECK_THAT(bad({"--max-nproc-per-node=100000", "x"}), Catch::Contains("--max-nproc-per-node"));
  CHECK_THAT(bad({"--max-nproc-per-node=4", "--nproc-per-node=5", "x"}),
             Catch::Contains("--max-nproc-per-node=4"));
  // Within the bounds, all is as before; the filter keeps each rank once.
  auto c = ok({"--max-nproc-per-node=2048", "--nproc-per-node=2000", "--local-ranks-filter=1,1,0",
               "--rdzv-conf=join_timeout=600,keep_alive_max_attempt=3", "x"});
  CHECK(c.max_nproc_per_node == 2048);
  CHECK(c.local_ranks_filter == std::vector<int>{1, 0});
  CHECK(ok({"--max_nproc_per_node", "8", "x"}).max_nproc_per_node == 8);
  CHECK_FALSE(ok({"x"}).max_nproc_per_node.has_value());
  CHECK(ok({"x"}, {{"PET_MAX_NPROC_PER_NODE", "16"}}).max_nproc_per_node == 16);
}

TEST_CASE("the workers-per-node bound follows the machine", "[unit][launch]") {
  MachineLimits big{-1, 4194304};  // no RLIMIT_NPROC, Linux's largest pid_max
  CHECK(default_nproc_bound(big) == 1024);
  CHECK(hard_nproc_bound(big) == 65536);
  MachineLimits small{96, 32768};  // RLIMIT_NPROC 96
  CHECK(default_nproc_bound(small) == 48);
  CHECK(hard_nproc_bound(small) == 96);
  MachineLimits pids{-1, 8192};  // pid_max 8192
  CHECK(default_nproc_bound(pids) == 512);
  CHECK(hard_nproc_bound(pids) == 4096);
  CHECK(default_nproc_bound({1, 100}) == 1);  // never below one worker
  CHECK(hard_nproc_bound({1, 100}) == 1);

  LaunchConfig c;
  CHECK_NOTHROW(check_nproc(1024, c, big));
  CHECK_THROWS_WITH(check_nproc(1025, c, big), Catch::Contains("--nproc-per-node=1025") &&
                                                   Catch::Contains("--max-nproc-per-node"));
  CHECK_THROWS_AS(check_nproc(49, c, small), ddp::ConfigError);
  c.max_nproc_per_node = 96;  // raised up to the hard bound
  CHECK_NOTHROW(check_nproc(96, c, small));
  CHECK_THROWS_WITH(check_nproc(97, c, small), Catch::Contains("--max-nproc-per-node=96"));
  c.max_nproc_per_node = 97;  // above the machine's hard bound
  CHECK_THROWS_WITH(check_nproc(10, c, small),
                    Catch::Contains("--max-nproc-per-node=97") && Catch::Contains("hard bound"));
  c.max_nproc_per_node = 65536;
  c.max_nodes = 65536;  // 2^32 workers in all: more than the world size allows
  CHECK_THROWS_WITH(check_nproc(65536, c, big), Catch::Contains("workers in all"));
}

TEST_CASE("the static backend on port 0 is an error, not a silent hang", "[unit][launch]") {
  CHECK_THAT(bad({"--rdzv-backend=static", "--master-port=0", "x"}),
             Catch::Contains("--master-port=0") && Catch::Contains("static"));
  CHECK_THAT(bad({"--master-port=0", "--nnodes=2", "--node-rank=1", "x"}),
             Catch::Contains("--master-port=0"));
  CHECK_THAT(bad({"--rdzv-endpoint=127.0.0.1:0", "x"}),
             Catch::Contains("--rdzv-endpoint=127.0.0.1:0"));
  CHECK(ok({"--standalone", "--master-port=0", "x"}).rdzv_backend == "c10d");  // a free port
  CHECK(ok({"--rdzv-backend=static", "--master-port=29501", "x"}).endpoint().port == 29501);
}

TEST_CASE("SIGUSR1 or SIGUSR2 in --signals-to-handle is warned about: it stops the job",
          "[unit][launch]") {
  auto r =
      parse_launch_args({"ddprun", "--standalone", "--signals-to-handle=SIGTERM,SIGUSR1", "x"}, {});
  REQUIRE(r.config.has_value());
  CHECK_THAT(r.notice, Catch::Contains("warning: --signals-to-handle lists SIGUSR1") &&
                           Catch::Contains("stop the job") && Catch::Contains("USR1@60"));
  CHECK(r.notice.find("SIGUSR2") == std::string::npos);
  // The default list passes SIGUSR1/2 on: no warning.
  r = parse_launch_args({"ddprun", "--standalone", "x"}, {});
  REQUIRE(r.config.has_value());
  CHECK(r.notice.find("warning") == std::string::npos);
}
