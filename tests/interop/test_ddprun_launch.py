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
    os._exit(0)  # not torch's exit: its gloo teardown can abort (docs/testing.md)
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
    # (tests/unit/launcher/rendezvous/round_test.cpp), so it is no longer a bad flag.


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


FAKE_UUIDS = ["GPU-0b6a1f3e-1111-2222-3333-444455556666", "GPU-7c2d9e10-1111-2222-3333-444455556666",
              "GPU-e4a8c2b5-1111-2222-3333-444455556666", "GPU-e9f01d27-1111-2222-3333-444455556666"]


def torch_device_count(cvd):
    """torch 2.15's own count for FAKE_UUIDS' machine: its NVML path with NVML's answers
    replaced by the fake machine's (what torch.cuda.device_count() returns on such a box)."""
    from unittest import mock
    import torch.cuda
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    with mock.patch.dict(os.environ, env, clear=True), \
            mock.patch.object(torch.cuda, "_raw_device_uuid_nvml", return_value=FAKE_UUIDS), \
            mock.patch.object(torch.cuda, "_raw_device_count_nvml", return_value=4):
        return torch.cuda._device_count_nvml()


@pytest.mark.parametrize("cvd,count", [
    (None, 4),                                    # unset: every GPU of the machine
    ("3,1,7,0", 2),                               # 7 is past the machine's GPUs: ends the list
    (f"GPU-e4a8,{FAKE_UUIDS[0]},2", 2),           # a UUID prefix, a UUID; the index ends it
    (f"2,{FAKE_UUIDS[0]}", 1),                    # forms never mix: the UUID ends the list
    (f"2,GPU-0b6a,0,1", 1),
    ("1,0,1", 0),                                 # a repeated index: no GPU at all
    ("", 0),
])
def test_nproc_per_node_gpu_counts_the_gpus_cuda_visible_devices_leaves(tmp_path, cvd, count):
    """--nproc-per-node=gpu counts what torch.cuda.device_count() would: the driver's GPUs (a
    fake /proc/driver/nvidia/gpus of 4 through DDPRUN_NVIDIA_GPUS_DIR) that
    CUDA_VISIBLE_DEVICES leaves visible; none visible is an error naming the variable."""
    gpus = tmp_path / "gpus"
    for i, uuid in enumerate(FAKE_UUIDS):
        d = gpus / f"0000:{0x1a + 0x20 * i:02x}:00.0"
        d.mkdir(parents=True)
        (d / "information").write_text(f"Model: \t\t NVIDIA H100\nGPU UUID: \t {uuid}\n"
                                       f"Bus Location: \t {d.name}\nDevice Minor: \t {i}\n")
    assert torch_device_count(cvd) == count  # the expectation is torch's own
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(DDPRUN_NVIDIA_GPUS_DIR=str(gpus), OUT=str(tmp_path))
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    p = subprocess.run([DDPRUN, "--standalone", "--nproc-per-node=gpu", "--no-python", "/bin/sh",
                        "-c", 'echo "$LOCAL_WORLD_SIZE" > "$OUT/worker-$LOCAL_RANK"'],
                       capture_output=True, text=True, timeout=120, env=env)
    if count == 0:
        assert p.returncode == 2, p.stderr
        assert "--nproc-per-node=gpu: no NVIDIA GPU is visible" in p.stderr
        assert f"CUDA_VISIBLE_DEVICES='{cvd}' leaves none of this machine's 4" in p.stderr
        assert not list(tmp_path.glob("worker-*"))
        return
    assert p.returncode == 0, p.stderr
    written = sorted(f.name for f in tmp_path.glob("worker-*"))
    assert written == [f"worker-{r}" for r in range(count)]
    assert {(tmp_path / w).read_text() for w in written} == {f"{count}\n"}


def test_nproc_per_node_auto_without_gpus_counts_the_cpus_this_process_may_use(tmp_path):
    """auto with no GPU visible, and cpu: the CPUs in ddprun's affinity mask, as torch's
    cpu_count() (len(os.sched_getaffinity(0))), not every CPU of the machine."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    env = dict(os.environ, DDPRUN_NVIDIA_GPUS_DIR=str(tmp_path / "no-driver"), OUT=str(tmp_path))
    for spec in ("auto", "cpu"):
        p = subprocess.run(["taskset", "-c", str(cpu), DDPRUN, "--standalone",
                            f"--nproc-per-node={spec}", "--no-python", "/bin/sh", "-c",
                            'echo "$LOCAL_WORLD_SIZE" > "$OUT/$0-$LOCAL_RANK"', spec],
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr
        assert sorted(f.name for f in tmp_path.glob(f"{spec}-*")) == [f"{spec}-0"]
    p = subprocess.run([DDPRUN, "--standalone", "--nproc-per-node=gpu", "/bin/true"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and "the driver lists none in" in p.stderr, p.stderr


def test_virtual_local_rank_as_torchrun(tmp_path):
    """--virtual-local-rank: every worker sees LOCAL_RANK=0 and its own entry of the parent's
    CUDA_VISIBLE_DEVICES (stripped), the same under torchrun 2.15 and ddprun; a list shorter
    than the workers stops the job before any worker starts."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    script = 'echo "$LOCAL_RANK [$CUDA_VISIBLE_DEVICES] $RANK" > "$OUT/$0-$RANK"'
    for name, launcher in (("torchrun", torchrun), ("ddprun", DDPRUN)):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="4, GPU-5e ,6", OUT=str(tmp_path))
        p = subprocess.run([launcher, "--standalone", "--nproc-per-node=2", "--virtual-local-rank",
                            "--no-python", "/bin/sh", "-c", script, name],
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 0, p.stderr
    for rank, seen in ((0, "0 [4] 0\n"), (1, "0 [GPU-5e] 1\n")):
        assert (tmp_path / f"torchrun-{rank}").read_text() == seen
        assert (tmp_path / f"ddprun-{rank}").read_text() == seen
    p = subprocess.run([DDPRUN, "--standalone", "--nproc-per-node=3", "--virtual-local-rank",
                        "--no-python", "/bin/sh", "-c", script, "short"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES="4,5", OUT=str(tmp_path)))
    assert p.returncode == 2, p.stderr
    assert "local rank 2 has no GPU in CUDA_VISIBLE_DEVICES=4,5 (2 entries)" in p.stderr
    assert not list(tmp_path.glob("short-*"))
