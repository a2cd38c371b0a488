"""The environment a worker sees under ddprun against the one it sees under real torchrun
(torch 2.x, `python -m torch.distributed.run`): the same env-dump script, the same launcher
environment, the same flags. Names added by the launcher must be the same set (but for a short,
documented allow-list), the fixed values must be equal, and the per-run values (port, run id,
error file) must have torchrun's shape. torchrun is the reference: any failure here on the
ddprun side is a difference in ddprun."""
import ipaddress
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
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

DUMP_SCRIPT = textwrap.dedent("""
    import json, os
    with open(os.path.join(os.environ["OUT"], os.environ["LOCAL_RANK"] + ".json"), "w") as f:
        f.write(json.dumps(dict(os.environ)))
""")

CASES = {
    "standalone-2": ["--standalone", "--nproc-per-node=2"],
    "standalone-1-restarts-role": ["--standalone", "--nproc-per-node=1", "--max-restarts=3",
                                   "--role", "trainer"],
}

# Names torchrun's workers see that are internal to torch's Python implementation, so ddprun
# need not set them (nor is it wrong if it does); they are left out of the name comparison.
TORCHRUN_INTERNAL = set()  # none left: TORCHELASTIC_SIGNALS_TO_HANDLE is exported too

# ddprun's own additions, for features torchrun does not have (docs/env_vars.md): a worker may
# use them; nothing of torchrun's contract changes. Only these may be added, none removed.
DDPRUN_OWN = {"DDPRUN_PROGRESS_FD", "DDPRUN_CONTROL_FD"}  # the progress and control pipes (docs/hangs.md, worker_runtime.md)

# Equal under both launchers, rank for rank (absent in both counts as equal: e.g.
# OMP_NUM_THREADS is only set when nproc-per-node > 1).
SAME_VALUE = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
              "GROUP_WORLD_SIZE", "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE",
              "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
              "TORCHELASTIC_USE_AGENT_STORE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
              "TORCHELASTIC_SIGNALS_TO_HANDLE",
              "OMP_NUM_THREADS"]

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def nproc(args):
    return int(next(a.split("=", 1)[1] for a in args if a.startswith("--nproc-per-node=")))


def run_launcher(cmd, args, out_dir, script):
    """Runs `cmd args script` with OUT=out_dir; returns (launcher env, [worker env per rank])."""
    env = dict(os.environ, OUT=str(out_dir), PYTHON_EXEC=sys.executable)
    env.pop("OMP_NUM_THREADS", None)
    p = subprocess.run([*cmd, *args, str(script)], capture_output=True, text=True, timeout=180,
                       env=env)
    assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    workers = [json.loads((out_dir / f"{r}.json").read_text()) for r in range(nproc(args))]
    return env, workers


class Runs(dict):
    """Keeps pytest from printing whole environments in failure reports."""

    def __repr__(self):
        return f"<runs of {self['args']}>"


@pytest.fixture(scope="module", params=list(CASES))
def envs(request, tmp_path_factory):
    """{"torchrun": (launcher env, workers), "ddprun": (...), "args": flags} for one case."""
    if not os.path.exists(DDPRUN):
        pytest.fail(f"ddprun not found at {DDPRUN}: build first or set DDP_BIN_DIR")
    args = CASES[request.param]
    tmp = tmp_path_factory.mktemp("env-" + request.param)
    script = tmp / "dump_env.py"
    script.write_text(DUMP_SCRIPT)
    result = Runs(args=args)
    for name, cmd in (("torchrun", TORCHRUN), ("ddprun", [DDPRUN])):
        out = tmp / name
        out.mkdir()
        result[name] = run_launcher(cmd, args, out, script)
    return result


def added_names(launcher_env, worker_env):
    return set(worker_env) - set(launcher_env) - TORCHRUN_INTERNAL - DDPRUN_OWN


def removed_names(launcher_env, worker_env):
    return set(launcher_env) - set(worker_env)


def test_same_names_added(envs):
    for rank in range(nproc(envs["args"])):
        t_env, t_workers = envs["torchrun"]
        d_env, d_workers = envs["ddprun"]
        t_added = added_names(t_env, t_workers[rank])
        d_added = added_names(d_env, d_workers[rank])
        assert t_added == d_added, (
            f"rank {rank}: only torchrun adds {sorted(t_added - d_added)}, "
            f"only ddprun adds {sorted(d_added - t_added)}")
        assert removed_names(t_env, t_workers[rank]) == removed_names(d_env, d_workers[rank])
        assert DDPRUN_OWN <= set(d_workers[rank]), "ddprun's own additions went missing"


@pytest.mark.parametrize("name", SAME_VALUE)
def test_same_value(envs, name):
    for rank in range(nproc(envs["args"])):
        t = envs["torchrun"][1][rank].get(name)
        d = envs["ddprun"][1][rank].get(name)
        assert t == d, f"rank {rank} {name}: torchrun {t!r}, ddprun {d!r}"


def is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost" or ipaddress.ip_address(socket.gethostbyname(host)).is_loopback


def test_master_addr_is_local(envs):
    """torchrun --standalone gives "localhost", ddprun "127.0.0.1": both reach this host."""
    for rank in range(nproc(envs["args"])):
        t = envs["torchrun"][1][rank]["MASTER_ADDR"]
        d = envs["ddprun"][1][rank]["MASTER_ADDR"]
        assert is_loopback(t) and is_loopback(d), f"torchrun {t!r}, ddprun {d!r}"


@pytest.mark.parametrize("launcher", ["torchrun", "ddprun"])
def test_master_port_shape(envs, launcher):
    workers = envs[launcher][1]
    ports = {w.get("MASTER_PORT") for w in workers}
    assert len(ports) == 1, f"{launcher}: ranks disagree on MASTER_PORT: {ports}"
    port = ports.pop()
    assert port is not None and port.isdigit() and 1024 <= int(port) <= 65535, (
        f"{launcher}: MASTER_PORT {port!r}")


@pytest.mark.parametrize("launcher", ["torchrun", "ddprun"])
def test_run_id_shape(envs, launcher):
    """--standalone: torchrun's run id is str(uuid.uuid4()), the same for every rank."""
    workers = envs[launcher][1]
    ids = {w.get("TORCHELASTIC_RUN_ID") for w in workers}
    assert len(ids) == 1, f"{launcher}: ranks disagree on TORCHELASTIC_RUN_ID: {ids}"
    run_id = ids.pop()
    assert run_id is not None and len(run_id) == 36 and UUID_RE.match(run_id), (
        f"{launcher}: TORCHELASTIC_RUN_ID {run_id!r}")


@pytest.mark.parametrize("launcher", ["torchrun", "ddprun"])
def test_error_file_shape(envs, launcher):
    """torchrun (no --log-dir) makes a temp log dir and gives each worker
    <tmp>/torchelastic_XXXX/<run_id>_XXXX/attempt_<restart>/<local_rank>/error.json; it only
    sets it to "" when logs go to /dev/null."""
    workers = envs[launcher][1]
    attempt_dirs = set()
    for rank, w in enumerate(workers):
        path = w.get("TORCHELASTIC_ERROR_FILE")
        assert path, f"{launcher} rank {rank}: TORCHELASTIC_ERROR_FILE {path!r}"
        assert os.path.isabs(path), f"{launcher} rank {rank}: {path!r}"
        parts = path.split(os.sep)
        assert parts[-3:] == ["attempt_0", w["LOCAL_RANK"], "error.json"], (
            f"{launcher} rank {rank}: TORCHELASTIC_ERROR_FILE {path!r}")
        attempt_dirs.add(os.sep.join(parts[:-2]))
    assert len(attempt_dirs) == 1, f"{launcher}: ranks in different attempt dirs {attempt_dirs}"
