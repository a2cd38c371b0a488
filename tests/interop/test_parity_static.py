"""The static backend and the rendezvous defaults, side by side with torch 2.15's torchrun (the
test venv's; it is the reference):

- (a) `--rdzv-backend=static --master-port=P`: workers that call PyTorch's own
  `init_process_group("gloo", init_method="tcp://localhost:P", ...)` all-reduce under both:
  rank 0's bind on P fails and torch forgives it (TORCHELASTIC_USE_AGENT_STORE), because the
  agent of node 0 serves P;
- (b) the workers see MASTER_PORT=P, MASTER_ADDR=--master-addr, on 1 node and on 2 nodes
  (two launchers on loopback, --node-rank 0 and 1);
- (c) a restart (--max-restarts=1, attempt 0's rank 1 exits 1) re-forms on the same port and
  completes with tcp:// and env://. ddprun does better than torchrun here: torchrun's static
  store keeps the workers' keys of attempt 0, so attempt 1 can read a dead rank's gloo
  address and hang; ddprun deletes them before the round's workers start (checked with a key
  that attempt 0 leaves, ddprun only);
- (d) the run id, MASTER_ADDR and MASTER_PORT defaults without --standalone: static on one
  node without --master-port (torch 2.15 makes it c10d on localhost:0 with a uuid4 run id),
  static with --master-port, c10d with --rdzv-endpoint, each with and without --rdzv-id, and
  --standalone; equal but for the values that differ per run (uuids, free ports).
Ports are picked by binding port 0 and closing it; a launcher that then finds the port taken
is run once more on another."""
import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from conftest import BIN

DDPRUN = os.path.join(BIN, "ddprun")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
LAUNCHERS = ("torchrun", "ddprun")
TIMEOUT = 60

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")

# One worker for every scenario, steered by its environment:
#   INIT=tcp|env   init_process_group("gloo") with tcp://localhost:$PORT or env://, all-reduce
#   FAIL=before    attempt 0: rank 1 exits 1 at once, rank 0 waits to be stopped (no store use)
#   FAIL=after     attempt 0: both ranks init, rank 0 leaves the key "attempt0_marker" in the
#                  store, both all-reduce, then rank 1 exits 1 (rank 0 waits to be stopped)
# Each attempt writes $OUT/<rank>.<restart>.json: its environment, the all-reduce's sum and
# whether the marker was still in the store when it started.
WORKER = textwrap.dedent("""
    import datetime, json, os, sys, time
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    init, fail = os.environ.get("INIT", ""), os.environ.get("FAIL", "")
    rec = {k: os.environ.get(k) for k in ("RANK", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
                                          "MASTER_ADDR", "MASTER_PORT")}
    def dump():
        with open(os.path.join(os.environ["OUT"], f"{rank}.{restart}.json"), "w") as f:
            json.dump(rec, f)
    if fail == "before" and restart == 0:
        dump()
        if rank == 1:
            sys.exit(1)
        time.sleep(120)
        sys.exit(2)
    if init:
        import torch, torch.distributed as dist
        client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                               is_master=False, timeout=datetime.timedelta(seconds=20))
        rec["stale_marker"] = client.check(["attempt0_marker"])
        method = f"tcp://localhost:{os.environ['PORT']}" if init == "tcp" else "env://"
        dist.init_process_group("gloo", init_method=method, rank=rank, world_size=ws,
                                timeout=datetime.timedelta(seconds=30))
        if fail == "after" and restart == 0 and rank == 0:
            client.set("attempt0_marker", "left by attempt 0")
        t = torch.tensor([rank + 1.0])
        dist.all_reduce(t)
        rec["sum"] = t.item()
        dump()
        if fail == "after" and restart == 0:
            if rank == 1:
                sys.exit(1)
            time.sleep(120)
            sys.exit(2)
        dist.destroy_process_group()
        os._exit(0)  # not torch's exit: its gloo teardown can abort (docs/testing.md)
    else:
        dump()
""")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_taken(p):
    text = (p.stdout or "") + (p.stderr or "")
    return p.returncode != 0 and ("in use" in text or "EADDRINUSE" in text)


def env_for(name, out, extra):
    env = dict(os.environ, OUT=str(out), **(extra or {}))
    for k in ("OMP_NUM_THREADS", "TORCHELASTIC_ERROR_FILE", "PYTHON_EXEC"):
        env.pop(k, None)
    if name == "ddprun":
        env["PYTHON_EXEC"] = sys.executable  # torchrun runs its own interpreter
    return env


def start(name, flags, tmp, out, extra=None):
    cmd = [TORCHRUN if name == "torchrun" else DDPRUN, *flags, str(tmp / "worker.py")]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env_for(name, out, extra), cwd=tmp)


def finish(proc):
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def records(out):
    """{(rank, restart): record} of one run."""
    recs = {}
    for f in os.listdir(out):
        rank, restart, _ = f.split(".")
        recs[(int(rank), int(restart))] = json.loads((out / f).read_text())
    return recs


def launch(name, tmp, flags, nodes=1, extra=None, port=None):
    """Runs `name` on `nodes` launchers (static: --node-rank i; with port: P is substituted for
    {port} in flags and given to the workers as $PORT). Returns ([CompletedProcess], records);
    picks another port once if the first was taken meanwhile."""
    if not os.path.exists(DDPRUN if name == "ddprun" else TORCHRUN):
        pytest.fail(f"{name} not found: build ddprun (DDP_BIN_DIR), use the test venv's python")
    (tmp / "worker.py").write_text(WORKER)
    for attempt in range(2):
        p = port if port is not None else free_port()
        out = tmp / f"{name}-{attempt}"
        out.mkdir()
        fl = [f.format(port=p) for f in flags]
        x = dict(extra or {}, PORT=str(p))
        procs = [start(name, fl + ([f"--node-rank={i}"] if nodes > 1 else []), tmp, out, x)
                 for i in reversed(range(nodes))]
        done = [finish(proc) for proc in reversed(procs)]
        if not any(port_taken(d) for d in done) or attempt == 1 or port is not None:
            return p, done, records(out)
    raise AssertionError("unreachable")


def check_ok(name, done):
    for i, d in enumerate(done):
        assert d.returncode == 0, f"{name} node {i} exited {d.returncode}:\n{d.stdout}\n{d.stderr}"


STATIC = ["--rdzv-backend=static", "--master-port={port}", "--master-addr=127.0.0.1"]


# ------------------------------------------------------------------ (a) tcp://localhost:P

@pytest.mark.parametrize("name", LAUNCHERS)
def test_tcp_init_method_on_master_port(name, tmp_path):
    port, done, recs = launch(name, tmp_path, [*STATIC, "--nproc-per-node=2"],
                              extra={"INIT": "tcp"})
    check_ok(name, done)
    assert sorted(recs) == [(0, 0), (1, 0)], recs
    for rec in recs.values():
        assert rec["sum"] == 3.0, rec
        assert rec["MASTER_PORT"] == str(port), rec


# ------------------------------------------------------------------ (b) MASTER_PORT = --master-port

@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("name", LAUNCHERS)
def test_workers_see_master_port(name, nodes, tmp_path):
    port, done, recs = launch(name, tmp_path,
                              [*STATIC, f"--nnodes={nodes}", "--nproc-per-node=1"], nodes=nodes)
    check_ok(name, done)
    assert sorted(recs) == [(r, 0) for r in range(nodes)], recs
    for rec in recs.values():
        assert rec["MASTER_PORT"] == str(port), (name, rec)
        assert rec["MASTER_ADDR"] == "127.0.0.1", (name, rec)
        assert rec["GROUP_RANK"] == rec["RANK"], rec


# ------------------------------------------------------------------ (c) restarts

@pytest.mark.parametrize("init", ["tcp", "env"])
@pytest.mark.parametrize("name", LAUNCHERS)
def test_restart_reforms_on_master_port(name, init, tmp_path):
    port, done, recs = launch(name, tmp_path, [*STATIC, "--nproc-per-node=2", "--max-restarts=1"],
                              extra={"INIT": init, "FAIL": "before"})
    check_ok(name, done)
    # attempt 0's rank 0 may be stopped before it writes its record
    assert set(recs) - {(0, 0)} == {(0, 1), (1, 0), (1, 1)}, recs
    for rank in (0, 1):
        assert recs[(rank, 1)]["sum"] == 3.0, recs
        assert recs[(rank, 1)]["MASTER_PORT"] == str(port), recs


@pytest.mark.parametrize("init", ["tcp", "env"])
def test_restart_never_sees_the_last_attempts_keys(init, tmp_path):
    """ddprun only: under torchrun attempt 0's keys stay (and its gloo addresses can hang
    attempt 1, seen 1 time in 2); ddprun clears them before attempt 1's workers start."""
    port, done, recs = launch("ddprun", tmp_path,
                              [*STATIC, "--nproc-per-node=2", "--max-restarts=1"],
                              extra={"INIT": init, "FAIL": "after"})
    check_ok("ddprun", done)
    assert sorted(recs) == [(0, 0), (0, 1), (1, 0), (1, 1)], recs
    for rank in (0, 1):
        assert recs[(rank, 0)]["sum"] == 3.0 and recs[(rank, 1)]["sum"] == 3.0, recs
        assert recs[(rank, 1)]["stale_marker"] is False, recs
        assert recs[(rank, 1)]["MASTER_PORT"] == str(port), recs


# ------------------------------------------------------------------ (d) defaults

def expected_local_master_addr():
    """torchrun's MASTER_ADDR for c10d and --standalone: socket.getfqdn(). ddprun gives the
    same when it names a loopback address; a job confined to this machine otherwise gets
    127.0.0.1 (ddprun keeps its store off the network, docs/decisions.md)."""
    fqdn = socket.getfqdn()
    try:
        addrs = {a[4][0] for a in socket.getaddrinfo(fqdn, None, type=socket.SOCK_STREAM)}
    except OSError:
        addrs = set()
    loop = addrs and all(a.startswith("127.") or a == "::1" for a in addrs)
    return fqdn, fqdn if loop else "127.0.0.1"


# (flags, what the run id is: "uuid" or the literal, MASTER_ADDR: "fqdn" or the literal,
# MASTER_PORT: "port" (the one in the flags) or "free")
DEFAULTS = {
    "static-1-node": (["--nproc-per-node=1"], "uuid", "fqdn", "free"),
    "static-1-node-id": (["--nproc-per-node=1", "--rdzv-id=myjob"], "uuid", "fqdn", "free"),
    "static-port": (["--nproc-per-node=1", "--master-port={port}"], "none", "127.0.0.1", "port"),
    "static-port-id": (["--nproc-per-node=1", "--master-port={port}", "--rdzv-id=myjob"],
                       "myjob", "127.0.0.1", "port"),
    "static-port-localhost": (["--nproc-per-node=1", "--master-addr=localhost",
                               "--master-port={port}"], "none", "localhost", "port"),
    "c10d": (["--nproc-per-node=1", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:{port}"],
             "none", "fqdn", "free"),
    "c10d-id": (["--nproc-per-node=1", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=myjob"], "myjob", "fqdn", "free"),
    "standalone": (["--nproc-per-node=1", "--standalone", "--rdzv-id=myjob"], "uuid", "fqdn",
                   "free"),
}


@pytest.mark.parametrize("case", list(DEFAULTS))
def test_run_id_and_master_defaults(case, tmp_path):
    flags, run_id, addr, port_kind = DEFAULTS[case]
    seen = {}
    for name in LAUNCHERS:
        tmp = tmp_path / name
        tmp.mkdir()
        port, done, recs = launch(name, tmp, flags)
        check_ok(name, done)
        rec = recs[(0, 0)]
        seen[name] = rec
        if run_id == "uuid":
            assert UUID_RE.match(rec["TORCHELASTIC_RUN_ID"]), (name, rec)
        else:
            assert rec["TORCHELASTIC_RUN_ID"] == run_id, (name, rec)
        if port_kind == "port":
            assert rec["MASTER_PORT"] == str(port), (name, rec)
        else:  # a free port of the launcher's; not the rendezvous endpoint's
            assert rec["MASTER_PORT"].isdigit(), (name, rec)
            if any("{port}" in f for f in flags):
                assert int(rec["MASTER_PORT"]) != port, (name, rec)
    t, d = seen["torchrun"]["MASTER_ADDR"], seen["ddprun"]["MASTER_ADDR"]
    if addr == "fqdn":
        fqdn, ours = expected_local_master_addr()
        assert t == fqdn, f"torchrun {t!r}, socket.getfqdn() {fqdn!r}"
        assert d == ours, f"torchrun {t!r}, ddprun {d!r}"
    else:
        assert t == d == addr, f"torchrun {t!r}, ddprun {d!r}"
