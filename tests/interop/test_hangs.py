"""Hangs and stragglers, each with a deliberately injected fault (issue 17): ddp-train with one
rank blocked before its all-reduce; an unmodified PyTorch gloo script whose rank 1 sleeps
before all_reduce while rank 0 waits inside it; the same across two agents on loopback; a rank
3x slower per step; a torch file-timer block that expires. Each asserts the rank, node and stack
function named, and the action taken. Stacks need py-spy (Python) or eu-stack (native); where a
tool is missing the report must say so, and the stack assertion is skipped visibly."""
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest

from support.pytest_tools import missing_tool, needs_tool

from conftest import BIN
from ddp_train_helpers import FMNIST, TRAIN, clean_env, fm_args, needs_ddp_train, needs_fmnist

DDPRUN = os.path.join(BIN, "ddprun")
VENV_BIN = os.path.dirname(sys.executable)
PATH = f"{BIN}:{VENV_BIN}:" + os.environ.get("PATH", "/usr/bin:/bin")
HAVE_PYSPY = shutil.which("py-spy", path=PATH) is not None
HAVE_EUSTACK = shutil.which("eu-stack", path=PATH) is not None


def run(argv, tmp_path, env=None, timeout=120):
    e = clean_env({"PATH": PATH, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5",
                   "PYTHON_EXEC": sys.executable, **(env or {})})
    return subprocess.run(argv, cwd=tmp_path, env=e, capture_output=True, text=True,
                          timeout=timeout)


def report(log_dir):
    found = [os.path.join(r, "hang_report.json") for r, _, fs in os.walk(log_dir)
             if "hang_report.json" in fs]
    assert len(found) == 1, found
    return json.load(open(found[0]))


def suspects(rep):
    """The ranks of the first (suspect) group of a hang_report.json."""
    return rep["groups"][0]["ranks"]


GLOO_SCRIPT = textwrap.dedent("""
    import os, time, datetime
    import torch, torch.distributed as dist
    def stuck_here():
        time.sleep(120)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=100))
    rank = dist.get_rank()
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == int(os.environ["SLEEPER"]):
        stuck_here()
    dist.all_reduce(t)
    print("done", t, flush=True)
    os._exit(0)  # not torch's exit: its gloo teardown can abort (docs/testing.md)
""")


@needs_tool(HAVE_PYSPY, "py-spy on PATH (the torch venv's)")
def test_gloo_script_sleeper_named_and_job_stopped(tmp_path):
    script = tmp_path / "g.py"
    script.write_text(GLOO_SCRIPT)
    logs = tmp_path / "logs"
    p = run([DDPRUN, "--standalone", "--nproc-per-node=2", "--hang-timeout=3", "--on-hang=stop",
             f"--log-dir={logs}", str(script)], tmp_path, env={"SLEEPER": "1"})
    assert p.returncode == 124, p.stderr
    rep = report(logs)
    assert suspects(rep) == [1], rep["groups"]
    assert "hang" in p.stderr and "rank 1" in p.stderr, p.stderr
    assert "stuck_here" in p.stderr, p.stderr
    funcs = {f["function"] for g in rep["ranks"] if g["rank"] == 0
             for t in g["threads"] for f in t["frames"]}
    assert any("all_reduce" in f for f in funcs), funcs


@needs_ddp_train
@needs_fmnist
def test_ddp_train_blocked_rank_named_and_restarted(tmp_path):
    logs = tmp_path / "logs"
    args = fm_args(1, 0, tmp_path / "s.ddp", None, "--batch-size", "32", "--max-steps", "12")
    p = run([DDPRUN, "--standalone", "--nproc-per-node=2", "--hang-timeout=2",
             "--on-hang=restart", "--max-restarts=1", f"--log-dir={logs}", "--no-python", TRAIN,
             *args], tmp_path, env={"DDP_TRAIN_FAULT": "1:3:hang"})
    assert p.returncode == 0, p.stderr  # the restart recovers (the fault is first-attempt only)
    assert "restarting" in p.stderr, p.stderr
    rep = report(logs)
    assert suspects(rep) == [1], rep["groups"]
    if HAVE_EUSTACK:
        assert "injected_hang_before_allreduce" in json.dumps(rep), rep
    else:
        missing_tool("eu-stack on PATH (Debian's elfutils): the stack assertion did not run")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_tool(HAVE_PYSPY, "py-spy on PATH (the torch venv's)")
def test_two_agents_name_the_remote_sleeper(tmp_path):
    script = tmp_path / "g.py"
    script.write_text(GLOO_SCRIPT)
    port = free_port()
    procs = []
    for node in range(2):
        logs = tmp_path / f"logs{node}"
        argv = [DDPRUN, "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=hang2", "--hang-timeout=3",
                "--on-hang=stop", f"--log-dir={logs}", str(script)]
        e = clean_env({"PATH": PATH, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5",
                       "PYTHON_EXEC": sys.executable, "SLEEPER": "3"})
        procs.append(subprocess.Popen(argv, cwd=tmp_path, env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=120))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("the two agents did not end:\n" + "\n".join(
            f"--- agent {i}:\n{p.communicate()[1]}" for i, p in enumerate(procs)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    assert codes == [124, 124], outs
    leader = next(i for i in range(2) if os.path.exists(tmp_path / f"logs{i}") and any(
        "hang_report.json" in fs for _, _, fs in os.walk(tmp_path / f"logs{i}")))
    rep = report(tmp_path / f"logs{leader}")
    assert suspects(rep) == [3], rep["groups"]
    r3 = next(r for r in rep["ranks"] if r["rank"] == 3)
    assert r3["local_rank"] == 1 and r3["node"], r3
    assert "stuck_here" in outs[leader][1], outs[leader][1]


@needs_ddp_train
@needs_fmnist
def test_slow_rank_named_as_straggler(tmp_path):
    logs = tmp_path / "logs"
    # ~1500 short steps: long enough for a few checks (every 250 ms with --hang-timeout=2).
    args = fm_args(200, 0, tmp_path / "s.ddp", None, "--batch-size", "64", "--max-steps", "1500",
                   "--no-eval")
    # 3x slower; the factor leaves room for a loaded machine (sanitizer builds) narrowing it.
    p = run([DDPRUN, "--standalone", "--nproc-per-node=3", "--straggler-factor=1.5",
             "--hang-timeout=2", f"--log-dir={logs}", "--no-python", TRAIN, *args], tmp_path,
            env={"DDP_TRAIN_FAULT": "2:1:slow=3"})
    assert p.returncode == 0, p.stderr
    lines = [l for l in p.stderr.splitlines() if "straggler" in l]
    assert lines and all("rank 2" in l for l in lines), p.stderr
    found = [os.path.join(r, "stragglers.json") for r, _, fs in os.walk(logs)
             if "stragglers.json" in fs]
    assert len(found) == 1
    assert [s["rank"] for s in json.load(open(found[0]))["stragglers"]] == [2]


def test_torch_file_timer_expiry_names_the_rank(tmp_path):
    script = tmp_path / "t.py"
    script.write_text(textwrap.dedent("""
        import os, time
        from torch.distributed.elastic.timer import FileTimerClient, configure, expires
        configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
        if os.environ["LOCAL_RANK"] == "1":
            with expires(after=1, scope="slow_block"):
                time.sleep(30)
        else:
            time.sleep(8)
    """))
    p = run([DDPRUN, "--standalone", "--nproc-per-node=2", "--hang-timeout=0", str(script)],
            tmp_path, env={"TORCHELASTIC_ENABLE_FILE_TIMER": "1"})
    assert p.returncode == 137, p.stderr  # the worker got torch's default signal, SIGKILL
    assert "torch file timer expired" in p.stderr and "slow_block" in p.stderr, p.stderr
    assert "rank 1 (local rank 1" in p.stderr, p.stderr
