"""The command lines and environments other tools generate for torchrun (issue 33;
shared/docs/anchors.md §9.3), each run unchanged as 2 "nodes" on loopback with a real torch DDP
script (gloo: an all_reduce and one DDP backward), under torchrun 2.15 and under ddprun, and the
workers' environment and argv compared rank for rank: Kubeflow training-operator v1's
PyTorchJob (plain and elastic), Kubeflow Trainer v2, TorchX's dist.ddp (script and -m module),
SkyPilot's line, and the legacy `python -m torch.distributed.launch` (ddprun: `ddprun launch`).

torchrun is the reference; where it cannot run the exact input (Kubeflow v1's elastic env sets
PET_STANDALONE to the empty string, which torch 2.15's parser reads as int('') and dies on),
the test pins that and runs it without that variable. Every wait is bounded."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from conftest import BIN
from ddprun_multinode_helpers import free_port

DDPRUN = os.path.join(BIN, "ddprun")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TORCH_LAUNCH = [sys.executable, "-m", "torch.distributed.launch"]

SCRIPT = """
import json, os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
model(torch.ones(1, 2)).sum().backward()
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE", "MASTER_ADDR", "MASTER_PORT"]
rec = {k: os.environ.get(k) for k in keys}
rec["argv"] = sys.argv[1:]
rec["sum"] = t.item()
rec["grad"] = model.module.weight.grad.tolist()
with open(os.path.join(os.environ["OUT"], os.environ["RANK"] + ".json"), "w") as f:
    json.dump(rec, f)
dist.destroy_process_group()
os._exit(0)  # not torch's exit: its gloo teardown can abort (docs/testing.md)
"""

# Compared rank for rank; MASTER_ADDR/MASTER_PORT only where the input fixes them (static).
SAME = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
        "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
        "argv", "sum", "grad"]
STATIC = ["MASTER_ADDR", "MASTER_PORT"]


# The workers' abort inside torch 2.15's c10d/Gloo setup on a loaded machine (seen under torchrun
# and, once in CI, under an ASan ddprun: both ranks at once, right after the "hostname of the
# client socket cannot be retrieved" warning). libstdc++ prints it when a joinable std::thread is
# destroyed; no ddprun code runs in a worker.
TORCH_ABORT = "terminate called without an active exception"


def port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def run_pair(launcher, nodes, out, base_env, tries=None):
    """nodes: [(argv, env)] per node, started together; returns {rank: record}. torch's own
    run is the reference, not what is tested: when it fails, it runs again (3 tries). Under
    ddprun, a run runs once more only when its workers died in torch's own abort
    (TORCH_ABORT), and a second failure fails the test. A node that fails ends the try: its
    peers get SIGTERM (they would wait out torch's own timeouts), then SIGKILL 15 s later."""
    if tries is None:
        tries = 3 if launcher in (TORCHRUN, TORCH_LAUNCH) else 2
    os.makedirs(out, exist_ok=True)
    procs = []
    for i, (argv, env) in enumerate(nodes):
        e = dict(base_env, **env, OUT=out)
        log = open(os.path.join(out, f"node{i}.log"), "w")
        procs.append((subprocess.Popen(launcher + argv, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=e), log))
    deadline = time.monotonic() + 150
    while any(p.poll() is None for p, _ in procs):
        if any(p.poll() not in (None, 0) for p, _ in procs) or time.monotonic() > deadline:
            for p, _ in procs:
                if p.poll() is None:
                    p.terminate()
            for p, _ in procs:
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            break
        time.sleep(0.2)
    codes = [p.returncode for p, _ in procs]
    logs = ""
    for i, (_, log) in enumerate(procs):
        log.close()
        logs += open(os.path.join(out, f"node{i}.log")).read()
    torch_own = launcher in (TORCHRUN, TORCH_LAUNCH) or TORCH_ABORT in logs
    if codes != [0] * len(nodes) and tries > 1 and torch_own:
        print(f"{launcher[-1]}: the run failed ({codes}); again:\n{logs[-2000:]}")
        shutil.rmtree(out)
        return run_pair(launcher, nodes, out, base_env, tries - 1)
    assert codes == [0] * len(nodes), f"{launcher[0]} exits {codes}:\n{logs}"
    recs = {}
    for f in os.listdir(out):
        if f.endswith(".json"):
            recs[int(f[:-5])] = json.load(open(os.path.join(out, f)))
    return recs, logs


@pytest.fixture
def job(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    pkg = tmp_path / "mods" / "ddpmod"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "SLURM_", "TORCHELASTIC_")) and
           k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHON_EXEC=sys.executable, PYTHONPATH=str(tmp_path / "mods"),
               OMP_NUM_THREADS="1")
    return str(script), env, tmp_path


def compare(ref, ours, keys):
    assert sorted(ref) == sorted(ours) == [0, 1], (ref, ours)
    for r in ref:
        for k in keys:
            assert ours[r][k] == ref[r][k], f"rank {r}: {k}: ddprun {ours[r][k]!r}, " \
                                            f"torchrun {ref[r][k]!r}"


def kubeflow_v1(script, port, elastic):
    nodes = []
    for n in range(2):
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2",
               "RANK": str(n), "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(n),
               "PET_NNODES": "2"}
        if elastic:
            env.update(PET_RDZV_ENDPOINT=f"127.0.0.1:{port}", PET_RDZV_BACKEND="c10d",
                       PET_NNODES="2:3", PET_MAX_RESTARTS="3", PET_RDZV_ID="pytorchjob-1234",
                       PET_RDZV_CONF="join_timeout=60,last_call_timeout=1", PET_STANDALONE="")
        nodes.append(([script], env))
    return nodes


def test_kubeflow_v1_pytorchjob(job):
    script, env, tmp = job
    # torchrun reads no MASTER_ADDR/MASTER_PORT: a static job on PET_MASTER_ADDR's default,
    # 127.0.0.1:29500, whatever the operator put in MASTER_PORT.
    if not port_free(29500):
        pytest.skip("port 29500 (torchrun's static default, which this input implies) is taken")
    nodes = kubeflow_v1(script, free_port(), elastic=False)
    ref, _ = run_pair(TORCHRUN, nodes, str(tmp / "torchrun"), env)
    ours, _ = run_pair([DDPRUN], nodes, str(tmp / "ddprun"), env)
    compare(ref, ours, SAME + STATIC)


def test_kubeflow_v1_elastic_pytorchjob(job):
    script, env, tmp = job
    port = free_port()
    nodes = kubeflow_v1(script, port, elastic=True)
    # torch 2.15 cannot start on the operator's exact environment: check_env's int('').
    bad = subprocess.run(TORCHRUN + [script], env=dict(env, **nodes[0][1], OUT=str(tmp)),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "invalid literal for int()" in bad.stderr, bad.stderr
    ours, logs = run_pair([DDPRUN], nodes, str(tmp / "ddprun"), env)
    without = [(argv, {k: v for k, v in e.items() if k != "PET_STANDALONE"})
               for argv, e in nodes]
    other = f"127.0.0.1:{free_port()}"  # a fresh store for torchrun's pair
    ref, _ = run_pair(TORCHRUN, [(a, dict(e, PET_RDZV_ENDPOINT=other)) for a, e in without],
                      str(tmp / "torchrun"), env)
    # The run id is the operator's; group ranks follow arrival order under both launchers.
    compare(ref, ours, [k for k in SAME if k not in ("GROUP_RANK", "RANK", "ROLE_RANK")])
    assert {r["RANK"] for r in ours.values()} == {"0", "1"}


def test_kubeflow_trainer_v2(job):
    script, env, tmp = job
    port = free_port()
    nodes = [([script], {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(n),
                         "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)})
             for n in range(2)]
    ref, _ = run_pair(TORCHRUN, nodes, str(tmp / "torchrun"), env)
    ours, _ = run_pair([DDPRUN], nodes, str(tmp / "ddprun"), env)
    compare(ref, ours, SAME + STATIC)


@pytest.mark.parametrize("module", [False, True])
def test_torchx_dist_ddp(job, module):
    script, env, tmp = job
    target = ["-m", "ddpmod"] if module else [script]

    def nodes():
        port = free_port()
        return [(["--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                  "--rdzv_id", "torchx-app-1", "--nnodes", "2", "--nproc_per_node", "1",
                  "--tee", "3", "--role", "", "--node_rank", str(n), *target, "--lr", "0.1"],
                 {}) for n in range(2)]
    ref, _ = run_pair(TORCHRUN, nodes(), str(tmp / "torchrun"), env)
    ours, _ = run_pair([DDPRUN], nodes(), str(tmp / "ddprun"), env)
    compare(ref, ours, [k for k in SAME if k not in ("GROUP_RANK", "RANK", "ROLE_RANK")])


def test_skypilot(job):
    script, env, tmp = job

    def nodes():
        port = free_port()
        return [([f"--nnodes=2", "--nproc_per_node=1", f"--node_rank={n}",
                  "--master_addr=127.0.0.1", f"--master_port={port}", script], {})
                for n in range(2)]
    ref, _ = run_pair(TORCHRUN, nodes(), str(tmp / "torchrun"), env)
    ours, _ = run_pair([DDPRUN], nodes(), str(tmp / "ddprun"), env)
    compare(ref, ours, [k for k in SAME + STATIC if k != "MASTER_PORT"])


@pytest.mark.parametrize("use_env", [False, True])
def test_legacy_torch_distributed_launch(job, use_env):
    """`python -m torch.distributed.launch --nproc_per_node=2 --master_port P script`: the
    script gets --local-rank=N before its own arguments (LOCAL_RANK too); with --use-env,
    LOCAL_RANK alone. ddprun's stand-in: `ddprun launch` with the same arguments."""
    script, env, tmp = job

    def nodes():
        extra = ["--use-env"] if use_env else []
        return [(["--nproc_per_node=2", "--master_port", str(free_port()), *extra, script,
                  "--epochs", "1"], {})]

    def pair(launcher, out):
        os.makedirs(out, exist_ok=True)
        recs, logs = run_pair(launcher, nodes(), out, env)
        return recs, logs
    ref, _ = pair(TORCH_LAUNCH, str(tmp / "torch"))
    ours, logs = pair([DDPRUN, "launch"], str(tmp / "ddprun"))
    compare(ref, ours, SAME)
    want = ["--epochs", "1"] if use_env else ["--local-rank=1", "--epochs", "1"]
    assert ours[1]["argv"] == want
    # The legacy mode's own refusal, in torch's words.
    p = subprocess.run([DDPRUN, "launch", "--no-python", "/bin/true"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "you must also set the '--use-env' flag" in p.stderr
