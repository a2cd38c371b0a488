// Tests of oom.hpp: the kernel's keyed files, /proc/<pid>/cgroup and mountinfo as found on
// cgroup v2, v1 and hybrid hosts (a container seeing a subtree included), and the verdict.
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "ddp/launch/oom.hpp"

using namespace ddp::launch;

TEST_CASE("oom_kill is read from memory.events, memory.oom_control and vmstat", "[unit][launch]") {
  CHECK(keyed_value("low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n", "oom_kill") ==
        1u);
  CHECK(keyed_value("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n", "oom_kill") == 7u);
  CHECK(keyed_value("nr_free_pages 5\noom_kill 18446744073709551615\n", "oom_kill") ==
        18446744073709551615u);
  CHECK_FALSE(keyed_value("oom_kill_disable 0\nunder_oom 0\n", "oom_kill"));
  CHECK_FALSE(keyed_value("oom_kill x\n", "oom_kill"));
  CHECK_FALSE(keyed_value("oom_kill \n", "oom_kill"));
  CHECK_FALSE(keyed_value("", "oom_kill"));
}

TEST_CASE("/proc/<pid>/cgroup gives the v2 path and v1's memory path", "[unit][launch]") {
  auto v2 = parse_proc_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n");
  CHECK(v2.unified == "/user.slice/user-1000.slice/session-2.scope");
  CHECK(v2.memory_v1.empty());
  auto hybrid = parse_proc_cgroup(
      "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/c56\n2:cpu,cpuacct:/x\n0::/\n");
  CHECK(hybrid.unified == "/");
  CHECK(hybrid.memory_v1 == "/process_api/c56");
  CHECK(parse_proc_cgroup("5:cpuset,memory:/job_7/step_0\n").memory_v1 == "/job_7/step_0");
  CHECK(parse_proc_cgroup("5:memoryx:/a\ngarbage\n").memory_v1.empty());
}

TEST_CASE("mountinfo gives the cgroup mounts, counter files follow", "[unit][launch]") {
  const char* hybrid =
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
      "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
  auto m = parse_mountinfo(hybrid);
  CHECK(m.unified_mount == "/sys/fs/cgroup/unified");
  CHECK(m.memory_mount == "/sys/fs/cgroup/memory");
  ProcCgroups cg{"/", "/process_api/c56"};
  CHECK(v1_counter_file(cg, m).path == "/sys/fs/cgroup/memory/process_api/c56/memory.oom_control");
  CHECK(v2_counter_file(cg, m).path == "/sys/fs/cgroup/unified/memory.events");

  // A pure v2 host, with optional fields before the separator.
  auto v2 = parse_mountinfo(
      "25 30 0:22 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n");
  CHECK(v2.unified_mount == "/sys/fs/cgroup");
  CHECK(v2.memory_mount.empty());
  CHECK(v2_counter_file({"/a/b", ""}, v2).path == "/sys/fs/cgroup/a/b/memory.events");
  CHECK(v1_counter_file({"/a/b", ""}, v2).path.empty());

  // A container that sees only its subtree, bind-mounted at /sys/fs/cgroup.
  auto sub = parse_mountinfo(
      "600 599 0:30 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"
      "601 599 0:31 /kube/p\\0401 /mnt/my\\040cg rw - cgroup cgroup rw,cpu,memory\n");
  CHECK(sub.unified_root == "/docker/abc");
  CHECK(v2_counter_file({"/docker/abc/w", ""}, sub).path == "/sys/fs/cgroup/w/memory.events");
  CHECK(v2_counter_file({"/docker/abc", ""}, sub).path == "/sys/fs/cgroup/memory.events");
  CHECK(v2_counter_file({"/docker/abcd", ""}, sub).path.empty());  // not below the root
  CHECK(v2_counter_file({"/other", ""}, sub).path.empty());
  CHECK(sub.memory_root == "/kube/p 1");
  CHECK(v1_counter_file({"", "/kube/p 1/w"}, sub).path == "/mnt/my cg/w/memory.oom_control");
}

TEST_CASE("only a SIGKILL with a higher cgroup count is the OOM killer's", "[unit][launch]") {
  OomWatch w;
  w.cgroup = {"/sys/fs/cgroup/a/memory.events", "/a"};
  w.at_spawn = 2;
  w.host_at_spawn = 10;
  auto yes = judge_oom(SIGKILL, w, 3, 11);
  CHECK(yes.kind == OomFinding::Kind::killed);
  CHECK_THAT(yes.text(), Catch::StartsWith("killed by the kernel's OOM killer (out of memory): "));
  CHECK_THAT(yes.text(), Catch::Contains("/sys/fs/cgroup/a/memory.events went from 2 to 3"));
  // The cgroup counted nothing: not OOM, whatever happened elsewhere on the host.
  CHECK(judge_oom(SIGKILL, w, 2, 50).kind == OomFinding::Kind::no);
  CHECK(judge_oom(SIGTERM, w, 3, 11).kind == OomFinding::Kind::no);
  CHECK(judge_oom(SIGSEGV, w, 3, 11).text().empty());
}

TEST_CASE("without a cgroup count, the host's count or nothing makes it 'possibly'",
          "[unit][launch]") {
  OomWatch w;
  w.host_at_spawn = 10;
  auto host = judge_oom(SIGKILL, w, std::nullopt, 12);
  CHECK(host.kind == OomFinding::Kind::possibly);
  CHECK_THAT(host.text(), Catch::StartsWith("possibly out of memory: "));
  CHECK_THAT(host.text(), Catch::Contains("killed 2 process(es) on this host"));
  CHECK(judge_oom(SIGKILL, w, std::nullopt, 10).kind == OomFinding::Kind::no);
  auto blind = judge_oom(SIGKILL, OomWatch{}, std::nullopt, std::nullopt);
  CHECK(blind.kind == OomFinding::Kind::possibly);
  CHECK_THAT(blind.text(), Catch::Contains("no OOM-kill count"));
  CHECK(judge_oom(SIGABRT, OomWatch{}, std::nullopt, std::nullopt).kind == OomFinding::Kind::no);
}

TEST_CASE("this process's own counters are found where the host has them", "[unit][launch]") {
  // Whatever the host: reading never throws, and a readable cgroup count names its file.
  const auto w = watch_oom(::getpid());
  if (w.at_spawn) CHECK_FALSE(w.cgroup.path.empty());
  CHECK(check_oom(w, SIGTERM).kind == OomFinding::Kind::no);
}
