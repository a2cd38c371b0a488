"""ddprun across nodes (issue 3): two agents on this host play two nodes over loopback, with the
c10d backend (the first agent hosts the store in-process, the other joins) and the static one
(--node-rank 0 hosts at --master-port). Covered here: an unmodified DDP job, rank layout,
duplicate node ranks, restart propagation with a job-wide budget, and exhausted restarts and
exit codes. Error files, output routing, orphans, stop signals and finished run ids are in
test_ddprun_multinode_exits.py; the helpers both use are in ddprun_multinode_helpers.py.

Every process is bounded: agents are waited on with timeouts, and whatever a test started
(agents, and workers whose PIDs they recorded) is killed in the fixture's teardown."""
import json
import re
import subprocess
import textwrap
import time
import uuid

import pytest

# `launcher` is a fixture: importing it is what makes it visible to the tests here.
from ddprun_multinode_helpers import (DDPSTORE, SH, free_port, launcher,  # noqa: F401
                                      listening, read_records, summary_block, wait_for)


# ------------------------------------------------------------------ 1. an unmodified DDP job

DDP_SCRIPT = textwrap.dedent("""
    import json, os, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")  # env://, from ddprun's environment alone
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1000 + rank)  # different initial weights: DDP must broadcast rank 0's
    model = torch.nn.Linear(4, 3)
    initial = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    model = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(7 * rank + 1)  # rank-dependent data
    for _ in range(5):
        x, y = torch.randn(16, 4, generator=g), torch.randn(16, 3, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    rec = {"rank": rank, "world": world, "env_rank": int(os.environ["RANK"]),
           "local_rank": int(os.environ["LOCAL_RANK"]),
           "group_rank": int(os.environ["GROUP_RANK"]), "agent": os.getppid(),
           "initial": initial, "params": flat.tolist(),
           "gathered": [t.tolist() for t in gathered]}
    with open(os.path.join(os.environ["OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(rec, f)
    dist.destroy_process_group()
    os._exit(0)  # not torch's exit: its gloo teardown can abort (docs/testing.md)
""")


def test_ddp_gloo_job_on_two_c10d_nodes(launcher, tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    a, b = launcher.c10d_pair(str(script), env={"OUT": str(tmp_path)})
    assert a.wait(150) == 0, a.output() + b.output()
    assert b.wait(30) == 0, a.output() + b.output()
    recs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["rank"] for r in recs] == [0, 1, 2, 3]
    assert all(r["world"] == 4 and r["env_rank"] == r["rank"] for r in recs)
    # Ranks are contiguous per node: group rank 0's agent runs ranks 0 and 1.
    for r in recs:
        assert r["group_rank"] == r["rank"] // 2 and r["local_rank"] == r["rank"] % 2
    assert recs[0]["agent"] == recs[1]["agent"] != recs[2]["agent"] == recs[3]["agent"]
    assert {recs[0]["agent"], recs[2]["agent"]} == {a.pid, b.pid}
    # Training happened (rank 0 moved away from its own initial weights) and DDP kept every
    # replica identical, seen both in each rank's own copy and in the all_gather.
    assert recs[0]["params"] != recs[0]["initial"]
    assert recs[1]["initial"] != recs[0]["initial"]
    for r in recs:
        assert r["params"] == recs[0]["params"]
        assert all(g == recs[0]["params"] for g in r["gathered"])


def test_both_agents_lose_the_port_to_a_passing_socket_and_still_meet(launcher, tmp_path):
    """A third process holds the endpoint's port (bound, not listening) as both agents start:
    neither can host, and nobody listens. Once the port is free one of them hosts after all,
    instead of both waiting as clients for the join timeout (seen in bench/recovery_bench.py,
    where an ephemeral port chosen for the store was taken a moment)."""
    import socket
    holder = socket.socket()  # no SO_REUSEADDR: the agents' binds fail while it holds the port
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    common = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={uuid.uuid4()}",
              "--rdzv-conf=join_timeout=60", *SH, "echo rank $RANK of $WORLD_SIZE"]
    try:
        a = launcher.start(*common, name="nodeA")
        b = launcher.start(*common, name="nodeB")
        time.sleep(1.5)  # both tried to host and could not
    finally:
        holder.close()
    t0 = time.monotonic()
    assert a.wait(40) == 0, a.output() + b.output()
    assert b.wait(20) == 0, a.output() + b.output()
    assert time.monotonic() - t0 < 30, a.output() + b.output()  # not the join timeout
    out = a.stdout + b.stdout
    assert "rank 0 of 2" in out and "rank 1 of 2" in out, a.output() + b.output()


# ------------------------------------------------------------------------ 2. static backend

ENV_DUMP = ('env | grep -E "^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|'
            'GROUP_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_RESTART_COUNT)=" '
            '| tr "\\n" " " > "$OUT/env_$NODE.$LOCAL_RANK.tmp" && '
            'mv "$OUT/env_$NODE.$LOCAL_RANK.tmp" "$OUT/env_$NODE.$LOCAL_RANK"')


def test_static_backend_ranks_follow_node_rank(launcher, tmp_path):
    port = free_port()
    common = ["--rdzv-backend=static", "--nnodes=2", "--nproc-per-node=2",
              "--master-addr=127.0.0.1", f"--master-port={port}"]
    # Node 1 first: it waits for node 0's store, and its ranks still come from --node-rank.
    n1 = launcher.start(*common, "--node-rank=1", *SH, ENV_DUMP, name="node1",
                        env={"OUT": str(tmp_path), "NODE": "1"})
    time.sleep(0.2)
    n0 = launcher.start(*common, "--node-rank=0", *SH, ENV_DUMP, name="node0",
                        env={"OUT": str(tmp_path), "NODE": "0"})
    assert n0.wait(60) == 0, n0.output() + n1.output()
    assert n1.wait(30) == 0, n0.output() + n1.output()
    envs = read_records(str(tmp_path), "env_")
    assert sorted(envs) == ["env_0.0", "env_0.1", "env_1.0", "env_1.1"], envs
    for name, e in envs.items():
        node, local = map(int, name[len("env_"):].split("."))
        assert e["LOCAL_RANK"] == str(local)
        assert e["RANK"] == str(node * 2 + local), (name, e)
        assert e["GROUP_RANK"] == str(node)
        assert e["WORLD_SIZE"] == "4" and e["GROUP_WORLD_SIZE"] == "2"
        assert e["LOCAL_WORLD_SIZE"] == "2" and e["TORCHELASTIC_RESTART_COUNT"] == "0"
    masters = {(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs.values()}
    assert len(masters) == 1, masters


# ------------------------------------------------------------------ 3. duplicate --node-rank

def joined(port, run_id):
    p = subprocess.run([DDPSTORE, "--endpoint", f"127.0.0.1:{port}", "--timeout-ms", "2000",
                        "add", f"/ddprun/{run_id}/r0/joined", "0"],
                       capture_output=True, text=True, timeout=10)
    return int(p.stdout) if p.returncode == 0 and p.stdout.strip().isdigit() else 0


@pytest.mark.parametrize("dup", [1, 0])
def test_duplicate_static_node_rank_is_a_clear_error(launcher, tmp_path, dup):
    port = free_port()
    run_id = "dup" + uuid.uuid4().hex[:8]
    nnodes = 3 if dup else 2  # with 3 nodes, the round stays open for the duplicate to join
    common = ["--rdzv-backend=static", f"--nnodes={nnodes}", "--nproc-per-node=1",
              "--master-addr=127.0.0.1", f"--master-port={port}", f"--rdzv-id={run_id}",
              "--rdzv-conf=join_timeout=30", *SH, "exec sleep 30"]
    n0 = launcher.start("--node-rank=0", *common, name="node0")
    assert wait_for(lambda: listening(port) or n0.proc.poll() is not None, 30), n0.output()
    if dup == 0:
        first = n0
    else:
        first = launcher.start(f"--node-rank={dup}", *common, name="first")
        assert wait_for(lambda: joined(port, run_id) >= 2, 15), first.output()
    second = launcher.start(f"--node-rank={dup}", *common, name="second")
    rc = second.wait(15)
    assert rc == 2, second.output()
    assert "node-rank" in second.stderr, second.output()
    assert first.proc.poll() is None, first.output()  # the first claim stands


# --------------------------------------------------------------- 4. restart propagation

FAILURES = {
    "sigkill": ("kill -9 $$", "Signal 9 (SIGKILL)"),
    "segfault": ('ulimit -c 0; exec "$PYTHON_EXEC" -c "import ctypes; ctypes.string_at(0)"',
                 "Signal 11 (SIGSEGV)"),
    "exit3": ("exit 3", "exit code 3"),
}

# Every worker records itself; rank 3 fails only on restart 0 and only once all four workers
# of that attempt are up, so each of them is seen to run (and be restarted).
RESTART_WORKER = """
f="$OUT/w_${{RANK}}_$TORCHELASTIC_RESTART_COUNT"
echo "rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT group=$GROUP_RANK agent=$PPID pid=$$" > "$f.tmp"
mv "$f.tmp" "$f"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$RANK" = 3 ]; then
    i=0
    while [ "$(ls "$OUT" | grep -c '^w_[0-9]_0$')" -lt 4 ] && [ $i -lt 400 ]; do
      sleep 0.05; i=$((i+1))
    done
    {fail}
  fi
  exec sleep 30
fi
echo "rank $RANK finished on restart $TORCHELASTIC_RESTART_COUNT"
"""


@pytest.mark.parametrize("how", sorted(FAILURES))
def test_failure_on_one_node_restarts_every_node(launcher, tmp_path, how):
    fail, described = FAILURES[how]
    a, b = launcher.c10d_pair("--max-restarts=1", *SH, RESTART_WORKER.format(fail=fail),
                              env={"OUT": str(tmp_path)})
    assert a.wait(60) == 0, a.output() + b.output()
    assert b.wait(30) == 0, a.output() + b.output()
    recs = read_records(str(tmp_path), "w_")
    assert sorted(recs) == [f"w_{r}_{c}" for r in range(4) for c in (0, 1)], \
        sorted(recs)  # all four ranks ran on restart 0 and again on restart 1
    for name, r in recs.items():
        assert r["group"] == str(int(r["rank"]) // 2), r
        assert name == f"w_{r['rank']}_{r['restart']}"
    # The restart count is job-wide: both nodes' workers saw 0, then 1.
    for c in ("0", "1"):
        assert {recs[f"w_{r}_{c}"]["agent"] for r in range(4)} == {str(a.pid), str(b.pid)}
    failing = str(recs["w_3_0"]["agent"])
    other = a if str(b.pid) == failing else b
    assert str(other.pid) != failing
    # The node that saw nothing fail locally still names the failure (rank and cause).
    line = [l for l in other.stderr.splitlines() if "rank 3 " in l]
    assert line, other.output()
    assert described in line[0] and "restart 1 of 1" in line[0], line[0]
    for ag in (a, b):
        assert "restart 2" not in ag.stderr, ag.output()
        assert "finished on restart 1" in ag.stdout, ag.output()


# --------------------------------------------------------------- 5. restarts exhausted

def test_restarts_exhausted_both_nodes_exit_with_the_root_cause_code(launcher, tmp_path):
    a, b = launcher.c10d_pair("--max-restarts=0", *SH,
                              RESTART_WORKER.format(fail="exit 7"), env={"OUT": str(tmp_path)})
    ra, rb = a.wait(60), b.wait(30)
    assert (ra, rb) == (7, 7), a.output() + b.output()
    recs = read_records(str(tmp_path), "w_")
    assert sorted(recs) == [f"w_{r}_0" for r in range(4)], sorted(recs)  # no restart
    failing, other = (a, b) if recs["w_3_0"]["agent"] == str(a.pid) else (b, a)
    summary = summary_block(failing.stderr)
    assert "Root Cause (first observed failure)" in summary, failing.output()
    assert "exitcode  : 7" in summary
    assert "rank      : 3 (local_rank: 1)" in summary
    assert re.search(r"rank 3 \(local_rank 1\).*exit code 7", other.stderr), other.output()
    assert "Root Cause" not in other.stderr  # the other ranks were stopped, not failures


