// ddprun under Slurm: which defaults come from which SLURM_* variable (taken from a real
// 2-node Slurm 22.05 step's environment), that flags and PET_* win, that a multi-node job
// never silently becomes a world of one, and the stop grace under KillWait.
#include "ddp/launch/slurm_env.hpp"

#include <catch2/catch.hpp>

#include "ddp/launch/config.hpp"
#include "ddp/proto/error.hpp"

using namespace ddp::launch;
using Env = std::map<std::string, std::string>;
using std::chrono::milliseconds;

namespace {

// `srun -N2 --ntasks-per-node=1` on node n2 of job 12, as slurmd sets it up.
Env step_on_n2() {
  return {{"SLURM_JOB_ID", "12"},
          {"SLURM_JOBID", "12"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEPID", "0"},
          {"SLURM_JOB_NODELIST", "n[1-2]"},
          {"SLURM_STEP_NODELIST", "n[1-2]"},
          {"SLURM_NNODES", "2"},
          {"SLURM_STEP_NUM_NODES", "2"},
          {"SLURM_NODEID", "1"},
          {"SLURMD_NODENAME", "n2"},
          {"SLURM_GTIDS", "1"},
          {"SLURM_NTASKS_PER_NODE", "1"},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x2)"}};
}

// The batch script of a one-node job with --ntasks-per-node=4.
Env batch_one_node() {
  return {{"SLURM_JOB_ID", "7"}, {"SLURM_JOB_NODELIST", "gpu-07"}, {"SLURM_NNODES", "1"},
          {"SLURM_NODEID", "0"}, {"SLURM_NTASKS_PER_NODE", "4"},   {"SLURMD_NODENAME", "gpu-07"}};
}

ParseResult parse(std::vector<std::string> args, const Env& env) {
  args.insert(args.begin(), "ddprun");
  return parse_launch_args(args, env);
}

LaunchConfig ok(std::vector<std::string> args, const Env& env) {
  auto r = parse(std::move(args), env);
  INFO(r.message);
  REQUIRE(r.config.has_value());
  return *r.config;
}

std::string bad(std::vector<std::string> args, const Env& env) {
  auto r = parse(std::move(args), env);
  REQUIRE_FALSE(r.config.has_value());
  CHECK(r.exit_code == 2);
  return r.message;
}

}  // namespace

TEST_CASE("outside Slurm nothing is derived", "[unit][slurm]") {
  auto d = slurm_defaults({{"PATH", "/bin"}});
  CHECK_FALSE(d.active);
  CHECK(d.args.empty());
  auto r = parse({"train.py"}, {});
  CHECK(r.notice.empty());
}

TEST_CASE("an srun task: nnodes, node rank, run id and endpoint from Slurm", "[unit][slurm]") {
  auto d = slurm_defaults(step_on_n2());
  CHECK(d.active);
  CHECK(d.in_step);
  CHECK(d.first_host == "n1");
  CHECK(d.layout_problem.empty());
  CHECK(d.args == std::vector<std::string>{"--nnodes=2", "--node-rank=1", "--rdzv-id=12.0"});

  auto c = ok({"--rdzv-backend=c10d", "train.py"}, step_on_n2());
  CHECK(c.min_nodes == 2);
  CHECK(c.max_nodes == 2);
  CHECK(c.rdzv_id == "12.0");
  CHECK(c.rdzv_endpoint == "n1");
  CHECK(c.endpoint().host == "n1");
  CHECK(c.endpoint().port == 29400);
  CHECK(c.nproc_per_node == "1");  // no GPUs, in a step: torchrun's default

  // torchrun's default backend (static): node rank and master address.
  auto s = ok({"train.py"}, step_on_n2());
  CHECK(s.rdzv_backend == "static");
  CHECK(s.node_rank == 1);
  CHECK(s.master_addr == "n1");
  CHECK(s.endpoint().port == 29500);
  CHECK(parse({"train.py"}, step_on_n2()).notice.find("--node-rank=1") != std::string::npos);
}

TEST_CASE("the node rank is this node's place in the step's node list", "[unit][slurm]") {
  auto env = step_on_n2();
  env["SLURM_STEP_NODELIST"] = "n[2-3]";  // the step runs on part of the job's nodes
  env["SLURM_JOB_NODELIST"] = "n[1-3]";
  auto d = slurm_defaults(env);
  CHECK(d.first_host == "n2");
  CHECK(d.args[1] == "--node-rank=0");
  env.erase("SLURMD_NODENAME");  // then SLURM_NODEID
  CHECK(slurm_defaults(env).args[1] == "--node-rank=1");
}

TEST_CASE("flags and PET_* win over Slurm's values", "[unit][slurm]") {
  auto c = ok({"--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=head:5000", "--rdzv-id=mine",
               "train.py"},
              step_on_n2());
  CHECK(c.min_nodes == 1);
  CHECK(c.max_nodes == 2);
  CHECK(c.rdzv_endpoint == "head:5000");
  CHECK(c.rdzv_id == "mine");
  auto env = step_on_n2();
  env["PET_NNODES"] = "3";
  env["PET_MASTER_ADDR"] = "10.0.0.9";
  auto p = ok({"train.py"}, env);
  CHECK(p.max_nodes == 3);
  CHECK(p.master_addr == "10.0.0.9");  // given: the node list's first host is not used
  auto n = ok({"--node-rank=0", "train.py"}, step_on_n2());
  CHECK(n.node_rank == 0);
}

TEST_CASE("workers per node: the task's GPUs, or a one-node batch's tasks", "[unit][slurm]") {
  auto env = step_on_n2();
  env["SLURM_GPUS_ON_NODE"] = "4";
  CHECK(ok({"train.py"}, env).nproc_per_node == "4");
  env["CUDA_VISIBLE_DEVICES"] = "2";  // --gpus-per-task=1 narrows it; GPUS_ON_NODE stays 4
  env["SLURM_STEP_GPUS"] = "2";
  CHECK(ok({"train.py"}, env).nproc_per_node == "1");
  CHECK(ok({"--nproc-per-node=3", "train.py"}, env).nproc_per_node == "3");

  auto b = ok({"train.py"}, batch_one_node());
  CHECK(b.nproc_per_node == "4");
  auto ntasks = batch_one_node();  // sbatch --ntasks=3 (no --ntasks-per-node)
  ntasks.erase("SLURM_NTASKS_PER_NODE");
  ntasks["SLURM_TASKS_PER_NODE"] = "3";
  CHECK(ok({"train.py"}, ntasks).nproc_per_node == "3");
  CHECK(b.max_nodes == 1);
  CHECK(b.rdzv_id == "7");
  CHECK(b.master_addr == "127.0.0.1");  // one node, static: stays local
  CHECK(ok({"--rdzv-backend=c10d", "train.py"}, batch_one_node()).rdzv_endpoint == "gpu-07");
  // --standalone: only the worker count comes from Slurm.
  auto sa = ok({"--standalone", "train.py"}, batch_one_node());
  CHECK(sa.nproc_per_node == "4");
  CHECK(sa.rdzv_endpoint == "localhost:0");
  CHECK(sa.rdzv_id != "7");
  // ... wherever it is on the command line, and in an srun task of a 2-node step too.
  auto step = step_on_n2();
  step["SLURM_GPUS_ON_NODE"] = "4";
  auto st = parse({"--nproc-per-node", "4", "--standalone", "train.py"}, step);
  REQUIRE(st.config);
  CHECK(st.config->max_nodes == 1);
  CHECK(st.config->node_rank == 0);
  CHECK(st.notice.find("--nnodes") == std::string::npos);
  CHECK(st.notice.find("--rdzv-id") == std::string::npos);
  auto pet = step;
  pet["PET_STANDALONE"] = "1";
  CHECK(ok({"train.py"}, pet).max_nodes == 1);
}

TEST_CASE("a multi-node job never silently becomes a world of one", "[unit][slurm]") {
  auto env = step_on_n2();
  env.erase("SLURM_STEP_NODELIST");
  env.erase("SLURM_JOB_NODELIST");
  auto msg = bad({"--rdzv-backend=c10d", "train.py"}, env);
  CHECK(msg.find("2-node job") != std::string::npos);
  CHECK(msg.find("SLURM_JOB_NODELIST is set") != std::string::npos);
  CHECK(msg.find("--rdzv-endpoint") != std::string::npos);
  CHECK(bad({"train.py"}, env).find("--master-addr") != std::string::npos);  // static too

  env["SLURM_STEP_NODELIST"] = "n[1-";
  CHECK(bad({"train.py"}, env).find("SLURM_STEP_NODELIST") != std::string::npos);
  // An explicit endpoint needs no node list.
  CHECK(ok({"--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "train.py"}, env).rdzv_endpoint == "h:1");
}

TEST_CASE("several ddprun tasks on a node, or a multi-node batch script, are refused",
          "[unit][slurm]") {
  auto env = step_on_n2();
  env["SLURM_GTIDS"] = "2,3";
  auto msg = bad({"train.py"}, env);
  CHECK(msg.find("2 ddprun tasks on this node") != std::string::npos);
  CHECK(msg.find("--ntasks-per-node=1") != std::string::npos);
  CHECK(ok({"--nnodes=4", "--rdzv-backend=c10d", "train.py"}, env).max_nodes == 4);
  env.erase("SLURM_GTIDS");  // then the step's compressed per-node counts, at this node
  env["SLURM_STEP_TASKS_PER_NODE"] = "1,3";
  CHECK(
      bad({"train.py"}, env).find("3 ddprun tasks on this node (SLURM_STEP_TASKS_PER_NODE=1,3)") !=
      std::string::npos);
  env["SLURM_STEP_TASKS_PER_NODE"] = "3,1";
  CHECK(ok({"train.py"}, env).max_nodes == 2);

  auto batch = batch_one_node();
  batch["SLURM_NNODES"] = "2";
  batch["SLURM_JOB_NODELIST"] = "gpu-[07-08]";
  CHECK(bad({"train.py"}, batch).find("batch script of a 2-node job") != std::string::npos);
  // --standalone does not hide it: the job would run on its first node only.
  CHECK(bad({"--standalone", "train.py"}, batch).find("batch script") != std::string::npos);
  CHECK(ok({"--standalone", "--nnodes=1", "train.py"}, batch).max_nodes == 1);
}

TEST_CASE("malformed SLURM_* values are named, and a flag that makes them moot wins",
          "[unit][slurm]") {
  auto env = step_on_n2();
  env["SLURM_STEP_NUM_NODES"] = "two";
  auto msg = bad({"train.py"}, env);
  CHECK(msg.find("SLURM_STEP_NUM_NODES (from Slurm) 'two' is not an integer") != std::string::npos);
  CHECK(msg.find("give --nnodes") != std::string::npos);
  CHECK(ok({"--nnodes=2", "train.py"}, env).max_nodes == 2);
  CHECK(ok({"train.py"},
           [&] {
             auto e = env;
             e["PET_NNODES"] = "2";
             return e;
           }())
            .max_nodes == 2);

  env = step_on_n2();
  env.erase("SLURM_GTIDS");
  env["SLURM_STEP_TASKS_PER_NODE"] = "1(x";
  CHECK(bad({"train.py"}, env).find("SLURM_STEP_TASKS_PER_NODE (from Slurm)") != std::string::npos);

  env = step_on_n2();
  env["SLURM_GPUS_ON_NODE"] = "x";
  CHECK(bad({"train.py"}, env).find("SLURM_GPUS_ON_NODE (from Slurm) 'x' is not an integer") !=
        std::string::npos);
  CHECK(ok({"--nproc-per-node=2", "train.py"}, env).nproc_per_node == "2");
  env["SLURM_GPUS_ON_NODE"] = "0";  // no GPUs: no default from it
  CHECK(ok({"train.py"}, env).nproc_per_node == "1");
  CHECK(parse({"--help"}, env).exit_code == 0);
}

TEST_CASE("the notice names only the Slurm values that stayed in effect", "[unit][slurm]") {
  auto r = parse({"--rdzv-backend=c10d", "--rdzv-id=mine", "train.py"}, step_on_n2());
  CHECK(r.notice.find("--nnodes=2") != std::string::npos);
  CHECK(r.notice.find("rendezvous host n1") != std::string::npos);
  CHECK(r.notice.find("--rdzv-id") == std::string::npos);
  auto given = parse({"--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "train.py"}, step_on_n2());
  CHECK(given.notice.find("rendezvous host") == std::string::npos);
}

TEST_CASE("a Slurm node rank beyond a given --nnodes is explained", "[unit][slurm]") {
  auto msg = bad({"--nnodes=1", "train.py"}, step_on_n2());
  CHECK(msg.find("node 1 of the Slurm step") != std::string::npos);
  CHECK(ok({"--nnodes=1", "--node-rank=0", "train.py"}, step_on_n2()).node_rank == 0);
}

TEST_CASE("KillWait from slurm.conf", "[unit][slurm]") {
  CHECK(parse_kill_wait("KillWait=5\n") == 5);
  CHECK(parse_kill_wait("ClusterName=x\n  killwait = 12 # comment\nMinJobAge=300") == 12);
  CHECK(parse_kill_wait("# KillWait=9\nKillWaitX=3\n") == std::nullopt);
  CHECK(parse_kill_wait("KillWait=abc\n") == std::nullopt);
  CHECK(parse_kill_wait("") == std::nullopt);
}

TEST_CASE("the stop grace ends before Slurm's SIGKILL", "[unit][slurm]") {
  CHECK(stop_grace(milliseconds(30000), std::nullopt) == milliseconds(30000));
  CHECK(stop_grace(milliseconds(30000), 30) == milliseconds(27000));
  CHECK(stop_grace(milliseconds(30000), 5) == milliseconds(4000));
  CHECK(stop_grace(milliseconds(2000), 30) == milliseconds(2000));
  CHECK(stop_grace(milliseconds(30000), 1) == milliseconds(500));
  CHECK(stop_grace(milliseconds(30000), 120) == milliseconds(30000));
}
