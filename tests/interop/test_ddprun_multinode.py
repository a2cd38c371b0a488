"""ddprun across nodes (issue 3): two agents on this host play two nodes over loopback, with the
c10d backend (the first agent hosts the store in-process, the other joins) and the static one
(--node-rank 0 hosts at --master-port). Covered: an unmodified DDP job, rank layout, duplicate
node ranks, restart propagation with a job-wide budget, exhausted restarts and exit codes,
error files, output routing (prefixes, tee, redirects, --log-dir, --local-ranks-filter), no
orphans after kill -9 of an agent, stop signals during the rendezvous, and finished run ids.

Every process is bounded: agents are waited on with timeouts, and whatever a test started
(agents, and workers whose PIDs they recorded) is killed in the fixture's teardown."""
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from conftest import BIN, Daemon, popen_retry

DDPRUN = os.path.join(BIN, "ddprun")
DDPSTORE = os.path.join(BIN, "ddpstore")
PYTHON_EXEC = sys.executable
SH = ("--no-python", "/bin/sh", "-c")


# ----------------------------------------------------------------------------------- helpers

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout, interval=0.02):
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def gone(pid):
    """True once `pid` no longer runs: absent, or a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split()[1] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True
    return False


def agent_env(extra=None):
    # A short grace so a worker that ignores SIGTERM can never stall a test for 30 s.
    return dict(os.environ, PYTHON_EXEC=PYTHON_EXEC, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="5",
                **(extra or {}))


def ddprun(*args, env=None, timeout=120):
    """A single-node run to completion; returns the CompletedProcess."""
    p = popen_retry([DDPRUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL, text=True, env=agent_env(env))
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"ddprun {' '.join(args)} did not finish in {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


class Agent:
    """One ddprun process (one 'node'); its stdout/stderr go to files, never a pipe that could
    fill up while the test waits on something else."""

    def __init__(self, args, workdir, name, env=None):
        self.name = name
        self.out_path = os.path.join(workdir, f"{name}.stdout")
        self.err_path = os.path.join(workdir, f"{name}.stderr")
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = popen_retry([DDPRUN, *args], stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, env=agent_env(env))
        self.pid = self.proc.pid

    @property
    def stdout(self):
        with open(self.out_path) as f:
            return f.read()

    @property
    def stderr(self):
        with open(self.err_path) as f:
            return f.read()

    def output(self):
        return f"--- {self.name} (pid {self.pid}) stdout:\n{self.stdout}\n" \
               f"--- {self.name} stderr:\n{self.stderr}"

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} still running after {timeout} s\n{self.output()}")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class Launcher:
    """What a test starts; teardown kills whatever is left of it."""

    def __init__(self, workdir):
        self.workdir = str(workdir)
        self.agents = []
        self.worker_pids = []  # (pid, marker): PIDs that workers of this test wrote down
        self.daemons = []

    def start(self, *args, name=None, env=None):
        a = Agent(args, self.workdir, name or f"agent{len(self.agents)}", env)
        self.agents.append(a)
        return a

    def c10d_pair(self, *args, nproc=2, run_id=None, env=None, host_first=True):
        """Two c10d agents on one endpoint. With host_first the first one is up (and so the
        host of the store) before the second starts: it is agents[0] of the pair."""
        port = free_port()
        common = ["--nnodes=2", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id or uuid.uuid4()}",
                  "--rdzv-conf=join_timeout=60"]
        a = self.start(*common, *args, name="nodeA", env=env)
        if host_first:
            assert wait_for(lambda: listening(port) or a.proc.poll() is not None, 30), \
                a.output()
            assert a.proc.poll() is None, a.output()
        b = self.start(*common, *args, name="nodeB", env=env)
        return a, b

    def cleanup(self):
        for a in self.agents:
            a.kill()
        for pid, marker in self.worker_pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() not in f.read():
                        continue  # not ours (or not any more)
                if not gone(pid):
                    os.kill(pid, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                pass
        for d in self.daemons:
            d.stop()


@pytest.fixture
def launcher(tmp_path):
    lx = Launcher(tmp_path)
    try:
        yield lx
    finally:
        lx.cleanup()


def read_records(out_dir, prefix):
    """Worker records: files <prefix>... holding 'k=v k=v ...'; returns {filename: dict}."""
    recs = {}
    for path in glob.glob(os.path.join(out_dir, prefix + "*")):
        if path.endswith(".tmp"):
            continue
        with open(path) as f:
            recs[os.path.basename(path)] = dict(kv.split("=", 1) for kv in f.read().split())
    return recs


def summary_block(stderr):
    """torchrun's failure summary: from the first '====' rule to the last."""
    start = stderr.find("=" * 60)
    assert start >= 0, "no failure summary in:\n" + stderr
    return stderr[start:]


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


# ------------------------------------------------------------------------ 6. error files

RECORD_SCRIPT = textwrap.dedent("""
    import os
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        if os.environ["RANK"] == "1":
            raise ValueError("boom")

    if __name__ == "__main__":
        main()
""")


def test_error_file_of_a_record_decorated_worker(tmp_path):
    script = tmp_path / "rec.py"
    script.write_text(RECORD_SCRIPT)
    logs = tmp_path / "logs"
    p = ddprun("--standalone", "--nproc-per-node=2", f"--log-dir={logs}", str(script),
               timeout=120)
    assert p.returncode == 1, p.stderr
    summary = summary_block(p.stderr)
    assert "ValueError: boom" in summary, summary
    files = glob.glob(str(logs / "*" / "attempt_0" / "1" / "error.json"))
    assert len(files) == 1, (files, summary)
    assert os.path.isfile(files[0])
    assert f"error_file: {files[0]}" in summary, summary
    assert "rank      : 1 (local_rank: 1)" in summary


# ------------------------------------------------------------------------------ 7. output

OUTPUT_WORKER = 'echo "out of rank $RANK"; echo "err of rank $RANK" >&2'


def test_tee_filter_and_log_dir(tmp_path):
    logs = tmp_path / "tee"
    p = ddprun("--standalone", "--nproc-per-node=2", "--log-dir", str(logs), "-t", "3",
               "--local-ranks-filter", "0", *SH, OUTPUT_WORKER)
    assert p.returncode == 0, p.stderr
    assert "[default0]:out of rank 0\n" in p.stdout, p.stdout
    assert "[default0]:err of rank 0\n" in p.stderr, p.stderr
    assert "rank 1" not in p.stdout + p.stderr  # filtered off the console ...
    attempts = glob.glob(str(logs / "*_*" / "attempt_0"))
    assert len(attempts) == 1, attempts
    for r in range(2):  # ... but every rank's raw lines are in its files
        d = os.path.join(attempts[0], str(r))
        assert open(os.path.join(d, "stdout.log")).read() == f"out of rank {r}\n"
        assert open(os.path.join(d, "stderr.log")).read() == f"err of rank {r}\n"


def test_redirect_keeps_workers_off_the_console(tmp_path):
    logs = tmp_path / "redirect"
    p = ddprun("--standalone", "--nproc-per-node=2", "--log-dir", str(logs), "-r", "3",
               *SH, OUTPUT_WORKER)
    assert p.returncode == 0, p.stderr
    assert "of rank" not in p.stdout + p.stderr, p.stdout + p.stderr
    for r in range(2):
        (d,) = glob.glob(str(logs / "*_*" / "attempt_0" / str(r)))
        assert open(os.path.join(d, "stdout.log")).read() == f"out of rank {r}\n"
        assert open(os.path.join(d, "stderr.log")).read() == f"err of rank {r}\n"


def test_custom_line_prefix_template():
    host = socket.gethostname()
    p = ddprun("--standalone", "--nproc-per-node=2",
               "--log-line-prefix-template", "[${host}:${group_rank}:${rank}]", *SH,
               OUTPUT_WORKER)
    assert p.returncode == 0, p.stderr
    for r in range(2):
        assert f"[{host}:0:{r}]out of rank {r}\n" in p.stdout, p.stdout
        assert f"[{host}:0:{r}]err of rank {r}\n" in p.stderr, p.stderr
    assert "[default" not in p.stdout


# ----------------------------------------------------- 8. no orphans after kill -9 of an agent

SLEEP_WORKER = ('echo "rank=$RANK agent=$PPID pid=$$" > "$OUT/p_$RANK.tmp" && '
                'mv "$OUT/p_$RANK.tmp" "$OUT/p_$RANK"; exec sleep 60')


def test_no_orphans_after_an_agent_is_killed(launcher, tmp_path):
    a, b = launcher.c10d_pair(*SH, SLEEP_WORKER, env={"OUT": str(tmp_path)})
    assert wait_for(lambda: len(read_records(str(tmp_path), "p_")) == 4, 60), \
        a.output() + b.output()
    recs = read_records(str(tmp_path), "p_").values()
    for r in recs:
        launcher.worker_pids.append((int(r["pid"]), "sleep"))
    workers = {ag.pid: [int(r["pid"]) for r in recs if r["agent"] == str(ag.pid)]
               for ag in (a, b)}
    assert sorted(map(len, workers.values())) == [2, 2], workers
    b.proc.send_signal(signal.SIGKILL)  # the client node dies
    b.wait(5)
    ok = wait_for(lambda: all(gone(p) for p in workers[b.pid]), 1.0, 0.01)
    assert ok, f"workers of the killed agent outlived it by 1 s: {workers[b.pid]}"
    # The dead agent's lease will ends the round: the other node stops its workers and waits
    # in the rendezvous for a second node (issue 4).
    assert wait_for(lambda: all(gone(p) for p in workers[a.pid]), 30), a.output()
    assert a.proc.poll() is None, a.output()
    # The agent stops its workers first and says why just after: wait for the line.
    assert wait_for(lambda: "died or stopped answering" in a.stderr, 10), a.output()

    t0 = time.monotonic()
    a.proc.send_signal(signal.SIGTERM)
    assert a.wait(15) == 128 + signal.SIGTERM, a.output()
    assert time.monotonic() - t0 < 10
    assert wait_for(lambda: all(gone(p) for p in workers[a.pid]), 2.0), workers[a.pid]


def test_killing_the_store_host_stops_the_other_node(launcher, tmp_path):
    a, b = launcher.c10d_pair(*SH, SLEEP_WORKER, env={"OUT": str(tmp_path)})
    assert wait_for(lambda: len(read_records(str(tmp_path), "p_")) == 4, 60), \
        a.output() + b.output()
    recs = read_records(str(tmp_path), "p_").values()
    for r in recs:
        launcher.worker_pids.append((int(r["pid"]), "sleep"))
    workers = {ag.pid: [int(r["pid"]) for r in recs if r["agent"] == str(ag.pid)]
               for ag in (a, b)}
    a.proc.send_signal(signal.SIGKILL)  # the node hosting the rendezvous store dies
    a.wait(5)
    assert wait_for(lambda: all(gone(p) for p in workers[a.pid]), 1.0, 0.01), workers[a.pid]
    # The other node loses the store, stops its workers and exits on its own.
    assert b.wait(15) == 1, b.output()
    assert "lost the rendezvous store" in b.stderr, b.output()
    assert wait_for(lambda: all(gone(p) for p in workers[b.pid]), 2.0), workers[b.pid]


# ------------------------------------------------------- 9. a stop signal in the rendezvous

@pytest.mark.parametrize("who", ["c10d_host", "static_client"])
def test_sigterm_while_waiting_in_the_rendezvous(launcher, who):
    port = free_port()
    if who == "c10d_host":  # hosts the store and waits for a second node that never comes
        ag = launcher.start("--nnodes=2", "--rdzv-backend=c10d",
                            f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=lonely", *SH,
                            "true")
        assert wait_for(lambda: listening(port) or ag.proc.poll() is not None, 30), ag.output()
    else:  # node rank 1 waits for node rank 0, which never starts its store
        ag = launcher.start("--rdzv-backend=static", "--nnodes=2", "--node-rank=1",
                            "--master-addr=127.0.0.1", f"--master-port={port}", *SH, "true")
    time.sleep(0.5)
    assert ag.proc.poll() is None, ag.output()
    t0 = time.monotonic()
    ag.proc.send_signal(signal.SIGTERM)
    rc = ag.wait(5)
    took = time.monotonic() - t0
    assert rc == 128 + signal.SIGTERM, ag.output()
    assert took < 2.0, took
    assert "signal 15" in ag.stderr, ag.output()


# ----------------------------------------------------------- 10. a finished run id is used up

def test_finished_run_id_cannot_be_reused(launcher):
    d = Daemon()
    launcher.daemons.append(d)
    common = ["--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{d.port}"]
    run_id = "once-" + uuid.uuid4().hex[:8]
    p = ddprun(*common, f"--rdzv-id={run_id}", *SH, "echo first run", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "first run" in p.stdout
    p = ddprun(*common, f"--rdzv-id={run_id}", *SH, "echo second run", timeout=60)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "second run" not in p.stdout
    assert "already finished" in p.stderr and "--rdzv-id" in p.stderr, p.stderr
    p = ddprun(*common, f"--rdzv-id={run_id}-2", *SH, "echo third run", timeout=60)
    assert p.returncode == 0, p.stderr
    assert "third run" in p.stdout
    assert d.stop() == 0, d.output()
