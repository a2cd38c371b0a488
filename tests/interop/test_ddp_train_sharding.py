"""ddp-train --sharding (issue 19) end to end, under ddprun on one host:
- every level (optimizer, gradients, full, full without prefetch, with --grad-accum) takes the
  very same steps as --sharding none: bitwise equal step losses and final parameters
  (param_checksum) on the shared-memory backend, whose reduce-scatter sums in the all-reduce's
  order; over plain gloo (DDP_SHM_ALLREDUCE=0, whose all-reduce sums in another order) within
  1e-5 relative;
- the MNIST convnet too (conv, pool and dropout layers gathered and reduce-scattered);
- sharded snapshots: a resume at the same world size is bitwise the uninterrupted run; a
  snapshot written at 4 ranks loads at 2 and 3 ranks and into a replicated run with the same
  parameters; continuing at 2 ranks from the 4-rank snapshot follows the uninterrupted 2-rank
  run (same global batches: within 1e-4, only the order of sums differs);
- a killed rank under full sharding restarts from the last committed sharded snapshot;
- SIGTERM stops every rank at one step boundary with one sharded snapshot, exit 143.
Bounded: small subsets, --max-steps, timeouts on every run."""
import json
import os
import signal
import struct
import subprocess
import time

import pytest

from ddp_train_helpers import (DDPRUN, FMNIST, TRAIN, clean_env, ddprun, fm_args, needs_ddp_train,
                               needs_fmnist, output, popen_retry, train)

pytestmark = [needs_ddp_train, needs_fmnist]

LEVELS = ("optimizer", "gradients", "full")


def metrics(path):
    with open(path) as f:
        return json.load(f)


def run_level(tmp_path, world, level, *opts, subset=512, env=None, epochs=1, tag=None,
              snapshot=""):
    m = tmp_path / f"m-{tag or level}-{world}.json"
    args = fm_args(epochs, 0, snapshot, m, "--batch-size", "16", "--optimizer", "adam",
                   "--no-eval", "--sharding", level, *opts, subset=subset)
    p = ddprun(world, args, tmp_path, env=env, timeout=240) if world > 1 else \
        train(args, tmp_path, env=env, timeout=240)
    assert p.returncode == 0, output(p)
    return metrics(m)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_level_takes_the_bits_of_none(tmp_path, world):
    base = run_level(tmp_path, world, "none")
    per_rank = -(-512 // world)  # DistributedSampler pads to a multiple of the world
    assert len(base["step_losses"]) == -(-per_rank // 16)
    for level in LEVELS:
        got = run_level(tmp_path, world, level)
        assert got["sharding"] == level
        assert got["step_losses"] == base["step_losses"], level
        assert got["param_checksum"] == base["param_checksum"], level


def test_grad_accum_and_no_prefetch_keep_the_bits(tmp_path):
    base = run_level(tmp_path, 3, "none", "--grad-accum", "2", tag="none-acc")
    for level, extra in (("gradients", []), ("full", []), ("full", ["--no-prefetch"])):
        got = run_level(tmp_path, 3, level, "--grad-accum", "2", *extra,
                        tag=f"{level}-acc{len(extra)}")
        assert got["param_checksum"] == base["param_checksum"], (level, extra)


def test_gloo_without_shared_memory_is_within_tolerance(tmp_path):
    env = {"DDP_SHM_ALLREDUCE": "0"}
    base = run_level(tmp_path, 2, "none", env=env, tag="none-gloo")
    got = run_level(tmp_path, 2, "full", env=env, tag="full-gloo")
    # 512 samples over 2 ranks, 16 a batch: 16 steps (zip would pass on empty lists).
    assert len(base["step_losses"]) == len(got["step_losses"]) == 16, (base, got)
    for a, b in zip(base["step_losses"], got["step_losses"]):
        assert abs(a - b) <= 1e-5 * abs(a), (a, b)


def test_convnet_full_sharding_equals_none(tmp_path):
    opts = ("--model", "convnet", "--max-steps", "3")
    base = run_level(tmp_path, 2, "none", *opts, subset=192, tag="cnn-none")
    got = run_level(tmp_path, 2, "full", *opts, subset=192, tag="cnn-full")
    assert len(base["step_losses"]) == 3
    assert got["step_losses"] == base["step_losses"]
    assert got["param_checksum"] == base["param_checksum"]


def read_index(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"DDPSIDX1", data[:8]
    (n,) = struct.unpack_from("<I", data, 8)
    return json.loads(data[12:12 + n])


def test_sharded_resume_same_world_is_the_uninterrupted_run(tmp_path):
    whole = run_level(tmp_path, 3, "full", epochs=2, tag="whole")
    snap = tmp_path / "s.ddp"
    first = run_level(tmp_path, 3, "full", epochs=1, tag="first", snapshot=snap)
    idx = read_index(snap)
    assert idx["world_size"] == 3 and idx["sharding"] == "full" and idx["epoch"] == 1
    assert len(idx["files"]) == 3
    rest = run_level(tmp_path, 3, "full", epochs=2, tag="rest", snapshot=snap)
    assert rest["resumed_from"] == {"epoch": 1, "step": 0}
    assert first["step_losses"] + rest["step_losses"] == whole["step_losses"]
    assert rest["param_checksum"] == whole["param_checksum"]


def test_snapshot_reshards_4_to_2_to_3_and_to_replicated(tmp_path):
    snap = tmp_path / "s.ddp"
    four = run_level(tmp_path, 4, "full", epochs=1, tag="four", snapshot=snap)
    # Nothing left to train: each run reports the parameters it loaded, re-cut for its world.
    for world, level in ((2, "full"), (3, "gradients"), (1, "full"), (2, "none")):
        got = run_level(tmp_path, world, level, epochs=1, tag=f"load-{world}-{level}",
                        snapshot=snap)
        assert got["resumed_from"] == {"epoch": 1, "step": 0}
        assert got["param_checksum"] == four["param_checksum"], (world, level)
    # Continuing at 2 ranks from the 4-rank snapshot: the global batches are those of an
    # uninterrupted 2-rank run with twice the per-rank batch, so both follow one curve.
    def two(*extra, tag, snapshot=""):
        m = tmp_path / f"m-{tag}.json"
        args = fm_args(2, 1, snapshot, m, "--batch-size", "32", "--optimizer", "adam",
                       "--no-eval", "--sharding", "full", *extra, subset=512)
        p = ddprun(2, args, tmp_path, timeout=240)
        assert p.returncode == 0, output(p)
        return metrics(m)
    whole = two(tag="two-whole")
    cont = two(tag="two-cont", snapshot=snap)
    assert cont["resumed_from"] == {"epoch": 1, "step": 0}
    # 512 samples over 2 ranks, 32 a batch: 8 steps an epoch, 2 epochs whole, 1 continued (an
    # empty cont would leave tail empty and the loop nothing to compare).
    assert len(whole["step_losses"]) == 16 and len(cont["step_losses"]) == 8, (whole, cont)
    tail = whole["step_losses"][len(whole["step_losses"]) - len(cont["step_losses"]):]
    for a, b in zip(tail, cont["step_losses"]):
        assert abs(a - b) <= 1e-4 * abs(a), (tail, cont["step_losses"])
    idx = read_index(snap)  # rewritten at 2 ranks, the 4-rank folder gone
    assert idx["world_size"] == 2 and idx["epoch"] == 2
    shards = os.listdir(str(snap) + ".shards")
    assert shards == [f"step-{idx['global_step']}"], shards


def test_a_killed_rank_restarts_from_the_last_sharded_snapshot(tmp_path):
    snap = tmp_path / "s.ddp"
    m = tmp_path / "m.json"
    args = fm_args(3, 1, snap, m, "--batch-size", "16", "--optimizer", "adam", "--no-eval",
                   "--sharding", "full", subset=256)
    p = ddprun(2, args, tmp_path, env={"DDP_TRAIN_FAULT": "1:12"},
               launcher_args=("--max-restarts=1",), timeout=240)
    assert p.returncode == 0, output(p)
    assert "kills itself at step 12" in p.stdout + p.stderr
    got = metrics(m)
    assert got["resumed_from"] == {"epoch": 1, "step": 0}  # 8 steps an epoch: saved at 8
    assert got["global_step"] == 24
    assert read_index(snap)["global_step"] == 24


def test_sigterm_stops_every_rank_at_one_boundary_with_one_snapshot(tmp_path):
    snap = tmp_path / "s.ddp"
    args = fm_args(1000, 0, snap, None, "--batch-size", "16", "--optimizer", "adam",
                   "--no-eval", "--sharding", "full", subset=512)
    argv = [DDPRUN, "--standalone", "--nproc-per-node=2", "--no-python", TRAIN, *args]
    env = clean_env({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "20"})
    p = popen_retry(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    cwd=str(tmp_path), env=env, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        seen = ""
        while "epoch 2/" not in seen and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            seen += line
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = seen + out + err
    # The job's code: ddprun ends on a stop signal with 128 + the signal (docs/launcher.md;
    # torchrun exits 1 with a SignalException traceback). Its summary shows no exit code for
    # stopped ranks; a rank's own 143 is test_ddp_train.py's test_sigterm_saves_snapshot.
    assert p.returncode == 128 + signal.SIGTERM, text[-3000:]
    assert "sharded snapshot" in text and "stop signal" in text, text[-3000:]
    idx = read_index(snap)
    assert idx["world_size"] == 2 and idx["global_step"] > 0
    # Resumes where it stopped.
    m = tmp_path / "m.json"
    args2 = fm_args(idx["epoch"] + 1, 0, snap, m, "--batch-size", "16", "--optimizer", "adam",
                    "--no-eval", "--sharding", "full", subset=512)
    p2 = ddprun(2, args2, tmp_path, timeout=240)
    assert p2.returncode == 0, output(p2)
    assert metrics(m)["resumed_from"] == {"epoch": idx["epoch"], "step": idx["step"]}


def test_a_bad_sharding_level_exits_2_naming_the_choices(tmp_path):
    p = train(fm_args(1, 0, "", None, "--sharding", "zero3"), tmp_path)
    assert p.returncode == 2, output(p)
    assert "--sharding 'zero3'" in p.stderr and "gradients" in p.stderr, output(p)
