"""ddprun as a user runs it on one node (issue 3 in progress): torchrun's environment, an
unmodified PyTorch gloo job through init_process_group("env://"), exit codes, restarts,
signal forwarding, the failure summary, a worker exiting 0 early (the job waits for the others,
as torchrun's does), and the static backend on port 0 refused."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import BIN

DDPRUN = os.path.join(BIN, "ddprun")


def ddprun(*args, env=None, timeout=120):
    e = dict(os.environ, PYTHON_EXEC=sys.executable, **(env or {}))
    return subprocess.run([DDPRUN, *args], capture_output=True, text=True, timeout=timeout, env=e)


def test_worker_environment_matches_torchrun(tmp_path):
    script = tmp_path / "env.sh"
    script.write_text('env | grep -E "^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|'
                      'GROUP_WORLD_SIZE|ROLE_NAME|ROLE_RANK|ROLE_WORLD_SIZE|MASTER_ADDR|'
                      'MASTER_PORT|TORCHELASTIC_[A-Z_]*|OMP_NUM_THREADS|'
                      'TORCH_NCCL_ASYNC_ERROR_HANDLING)=" | sort > "$OUT/$LOCAL_RANK"\n')
    p = ddprun("--standalone", "--nproc-per-node=2", "--max-restarts=2", "--no-python",
               "/bin/sh", str(script), env={"OUT": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    envs = [dict(l.split("=", 1) for l in (tmp_path / str(r)).read_text().split("\n") if l)
            for r in range(2)]
    for r, e in enumerate(envs):
        assert e["RANK"] == str(r) and e["LOCAL_RANK"] == str(r) and e["ROLE_RANK"] == str(r)
        assert e["WORLD_SIZE"] == "2" and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["GROUP_RANK"] == "0" and e["GROUP_WORLD_SIZE"] == "1"
        assert e["ROLE_NAME"] == "default" and e["ROLE_WORLD_SIZE"] == "2"
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0"
        assert e["TORCHELASTIC_MAX_RESTARTS"] == "2"
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert e["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
        assert e["OMP_NUM_THREADS"] == "1"
        assert len(e["TORCHELASTIC_RUN_ID"]) == 36
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"] != "29500"


GLOO_SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")  # env://: MASTER_ADDR/PORT is ddprun's in-process store
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} sum {int(t.item())}", flush=True)
    dist.destroy_process_group()
""")


def test_unmodified_pytorch_gloo_job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(GLOO_SCRIPT)
    p = ddprun("--standalone", "--nproc-per-node=2", str(script), timeout=180)
    assert p.returncode == 0, p.stderr
    assert "rank 0 sum 3" in p.stdout and "rank 1 sum 3" in p.stdout


def test_exit_code_and_failure_summary():
    p = ddprun("--standalone", "--nproc-per-node=2", "--no-python", "/bin/sh", "-c",
               'if [ "$LOCAL_RANK" = 1 ]; then exit 7; fi; exec sleep 30')
    assert p.returncode == 7
    assert "/bin/sh FAILED" in p.stderr
    assert "rank      : 1 (local_rank: 1)" in p.stderr
    assert "exitcode  : 7" in p.stderr


def test_signal_death_gives_128_plus_signal():
    p = ddprun("--standalone", "--no-python", "/bin/sh", "-c", "kill -SEGV $$")
    assert p.returncode == 128 + signal.SIGSEGV
    assert "Signal 11 (SIGSEGV)" in p.stderr


def test_restart_after_a_failure(tmp_path):
    p = ddprun("--standalone", "--nproc-per-node=2", "--max-restarts=1", "--no-python", "/bin/sh", "-c",
               'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$LOCAL_RANK" = 0 ]; then exit 1; fi;'
               ' echo "attempt $TORCHELASTIC_RESTART_COUNT rank $LOCAL_RANK ok"')
    assert p.returncode == 0, p.stderr
    assert "restarting the workers of every node, restart 1 of 1" in p.stderr
    assert "attempt 1 rank 0 ok" in p.stdout and "attempt 1 rank 1 ok" in p.stdout


def test_sigterm_is_forwarded_and_workers_stop(tmp_path):
    marker = tmp_path / "got_term"
    proc = subprocess.Popen(
        [DDPRUN, "--standalone", "--nproc-per-node=2", "--no-python", "/bin/sh", "-c",
         f'trap "echo $LOCAL_RANK >> {marker}; exit 0" TERM; echo up; while :; do sleep 0.05; done'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert sorted([proc.stdout.readline().strip(), proc.stdout.readline().strip()]) == \
        ["[default0]:up", "[default1]:up"]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert sorted(marker.read_text().split()) == ["0", "1"]


def test_bad_flags_exit_2():
    p = ddprun("--nproc-per-node=zero", "x.py")
    assert p.returncode == 2
    assert "--nproc-per-node" in p.stderr
    p = ddprun("--nnodes=1:2", "--rdzv-backend=static", "x.py")
    assert p.returncode == 2
    assert "the static backend needs a fixed --nnodes" in p.stderr
    p = ddprun("--nnodes=1:2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:1",
               "--rdzv-conf=keep_alive_max_attempt=zero", "x.py")
    assert p.returncode == 2
    assert "keep_alive_max_attempt 'zero'" in p.stderr
    p = ddprun("--nnodes=2", "--node-rank=2", "x.py")
    assert p.returncode == 2
    assert "--node-rank=2 is not below --nnodes=2" in p.stderr
    # An unknown macro in --log-line-prefix-template is left as written, as torchrun does
    # (tests/unit/launch/round_test.cpp), so it is no longer a bad flag.


def test_static_backend_on_port_0_is_an_error_not_a_hang():
    p = ddprun("--rdzv-backend=static", "--master-port=0", "--no-python", "/bin/true",
               timeout=30)
    assert p.returncode == 2, p.stderr
    assert "--master-port=0" in p.stderr and "static backend" in p.stderr


def test_an_early_exit_0_waits_for_the_others():
    start = time.monotonic()
    p = ddprun("--standalone", "--nproc-per-node=2", "--no-python", "/bin/sh", "-c",
               'if [ "$LOCAL_RANK" = 1 ]; then exit 0; fi; sleep 1; echo rank 0 done')
    assert p.returncode == 0, p.stderr
    assert time.monotonic() - start >= 1
    assert "[default0]:rank 0 done" in p.stdout


def test_an_early_exit_0_then_a_failure_fails_the_job():
    p = ddprun("--standalone", "--nproc-per-node=2", "--no-python", "/bin/sh", "-c",
               'if [ "$LOCAL_RANK" = 1 ]; then exit 0; fi; sleep 1; exit 3')
    assert p.returncode == 3, p.stderr
    assert "rank      : 0 (local_rank: 0)" in p.stderr
    assert "exitcode  : 3" in p.stderr
    assert "rank      : 1" not in p.stderr  # the early exit 0 is no failure


def test_redirected_output_is_kept_in_a_private_folder(tmp_path):
    """-r/--redirects without --log-dir: the temporary folder holds the only copy of the
    output, so it is kept and named (torchrun's folder is private: 0700, and so is ours)."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = ddprun("--standalone", "--nproc-per-node=1", "--redirects=3", "--no-python", "/bin/echo",
               "kept-output", env=env)
    assert p.returncode == 0, p.stderr
    line = [ln for ln in p.stderr.splitlines() if "redirected output is in" in ln]
    assert len(line) == 1, p.stderr
    root = line[0].rsplit(" ", 1)[1]
    assert root.startswith(str(tmp_path)), root
    assert oct(os.stat(root).st_mode & 0o777) == oct(0o700)
    out = open(os.path.join(root, "attempt_0", "0", "stdout.log")).read()
    assert out == "kept-output\n"
    # Without files asked for, the temporary folder goes as before.
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    p = ddprun("--standalone", "--nproc-per-node=1", "--no-python", "/bin/true",
               env=dict(os.environ, TMPDIR=str(quiet)))
    assert p.returncode == 0 and os.listdir(quiet) == [], p.stderr
