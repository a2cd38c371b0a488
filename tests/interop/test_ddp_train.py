"""ddp-train (docs/ddp_train.md), the built-in C++ data-parallel trainer, run as users run it:
under ddprun (--no-python: it is a program, not a script) and alone (no RANK: world size 1).

Covered here: N ranks with batch B/N take the same steps as one rank with batch B (SGD and
Adam), gradient accumulation equals the big batch, same seed same run, a rank SIGKILLed
mid-epoch under `ddprun --max-restarts=1` resumes to the very parameters of an uninterrupted
run, and SIGUSR1/SIGTERM snapshots and resuming from them. Bad inputs, the autoencoder, other
launchers and the GPU path are in test_ddp_train_variants.py; the helpers both use are in
ddp_train_helpers.py.

Every run is small (--train-subset 2048, --threads 1: seconds on 2 cores), works in tmp_path
(the default snapshot path is relative to the working directory, and a snapshot found at start
is resumed from, so every run names its own), and is bounded by a timeout. Snapshots are parsed
and their FNV-1a 64 checksum verified here, independently of the trainer.
"""
import math
import os
import re
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import popen_retry
from ddp_train_helpers import (SUBSET, TRAIN, checksum_value, clean_env, ddprun, fm_args,
                               needs_ddp_train, needs_fmnist, output, read_metrics,
                               read_snapshot, train)

pytestmark = needs_ddp_train


# ----------------------------------------------------- 1. N ranks with B/N == one rank with B

@needs_fmnist
@pytest.mark.parametrize("optimizer,lr", [("sgd", "0.1"), ("adam", "1e-3")])
def test_n_ranks_equal_one_rank(tmp_path, optimizer, lr):
    # Adam runs at its default lr: its first step is lr * g / (|g| + eps), whose sensitivity to
    # rounding in a near-zero g is lr / eps; at lr 0.1 float summation order alone could move
    # such a weight by more than the tolerance.
    common = ["--optimizer", optimizer, "--lr", lr, "--seed", "7", "--no-eval"]
    two = ddprun(2, fm_args(1, 0, tmp_path / "two.ddp", None, "--batch-size", "16",
                            "--max-steps", "3", *common), tmp_path)
    assert two.returncode == 0, output(two)
    one = ddprun(1, fm_args(1, 0, tmp_path / "one.ddp", None, "--batch-size", "32",
                            "--max-steps", "3", *common), tmp_path)
    assert one.returncode == 0, output(one)
    early = train(fm_args(1, 0, tmp_path / "early.ddp", None, "--batch-size", "32",
                          "--max-steps", "1", *common), tmp_path)
    assert early.returncode == 0, output(early)

    h2, p2, o2, _ = read_snapshot(tmp_path / "two.ddp")
    h1, p1, o1, _ = read_snapshot(tmp_path / "one.ddp")
    he, pe, _, _ = read_snapshot(tmp_path / "early.ddp")
    assert h2["global_step"] == h1["global_step"] == 3, (h2, h1)
    assert he["global_step"] == 1, he
    assert (h2["epoch"], h2["step"]) == (h1["epoch"], h1["step"]) == (0, 3), (h2, h1)
    assert h2["world_size"] == 2 and h1["world_size"] == 1, (h2, h1)
    assert h2["batch_size"] == 16 and h1["batch_size"] == 32, (h2, h1)
    assert h2["model"] == h1["model"] == "mlp" and h2["optimizer"] == optimizer, h2
    assert h2["seed"] == 7, h2
    # Training moved the weights: the 3-step run is not the 1-step run.
    assert np.max(np.abs(p1 - pe)) > 1e-4, "3 steps left the parameters where 1 step did"
    diff = np.max(np.abs(p2 - p1))
    assert diff <= (1e-5 if optimizer == "sgd" else 5e-5), \
        f"2 ranks x batch 16 and 1 rank x batch 32 differ by up to {diff}"
    if optimizer == "adam":
        # Adam is blind to the scale of the gradient; its first moment is not: summing instead
        # of averaging the ranks' gradients would double it.
        assert h2["opt_state"] == h1["opt_state"] == 2 * h1["params"], (h2, h1)
        assert h2["adam_t"] == h1["adam_t"] == 3, (h2, h1)
        np.testing.assert_allclose(o2, o1, rtol=1e-3, atol=1e-7)
        assert np.max(np.abs(o1)) > 1e-6


# ------------------------------------------------------- 2. gradient accumulation == big batch

@needs_fmnist
def test_grad_accum_equals_big_batch(tmp_path):
    common = ["--optimizer", "sgd", "--lr", "0.1", "--seed", "3", "--max-steps", "2",
              "--no-eval"]
    acc = train(fm_args(1, 0, tmp_path / "acc.ddp", None, "--batch-size", "8",
                        "--grad-accum", "4", *common), tmp_path)
    assert acc.returncode == 0, output(acc)
    big = train(fm_args(1, 0, tmp_path / "big.ddp", None, "--batch-size", "32", *common),
                tmp_path)
    assert big.returncode == 0, output(big)
    ha, pa, _, _ = read_snapshot(tmp_path / "acc.ddp")
    hb, pb, _, _ = read_snapshot(tmp_path / "big.ddp")
    # --max-steps counts optimizer steps, so 2 steps of 4 micro-batches each.
    assert ha["global_step"] == hb["global_step"] == 2, (ha, hb)
    diff = np.max(np.abs(pa - pb))
    assert diff <= 1e-5, f"batch 8 x grad-accum 4 and batch 32 differ by up to {diff}"


# --------------------------------------------------------------- 3. same seed, same run

@needs_fmnist
def test_same_seed_same_losses(tmp_path):
    def run(name, seed, snapshot):
        work = tmp_path / name
        work.mkdir()
        p = ddprun(2, fm_args(1, 0, snapshot if snapshot is not None else work / "s.ddp",
                              work / "m.json", "--lr", "0.1", "--seed", str(seed)), work)
        assert p.returncode == 0, output(p)
        return p, read_metrics(work / "m.json"), work

    pa, a, _ = run("a", 11, None)
    pb, b, _ = run("b", 11, None)
    pc, c, work_c = run("c", 12, "")  # snapshots off: nothing may be written at all
    assert a["epoch_losses"] == b["epoch_losses"], (a["epoch_losses"], b["epoch_losses"])
    assert a["final_loss"] == b["final_loss"]
    assert checksum_value(a["param_checksum"]) == checksum_value(b["param_checksum"])
    assert checksum_value(a["param_checksum"]) != checksum_value(c["param_checksum"])
    assert a["epoch_losses"] != c["epoch_losses"]
    assert not [f for f in os.listdir(work_c) if f != "m.json"], os.listdir(work_c)
    for m in (a, b, c):
        assert m["model"] == "mlp" and m["dataset"] == "fashion-mnist", m
        assert m["world_size"] == 2 and m["epochs_run"] == 1, m
        assert m["steps"] == SUBSET // (2 * 32), m
        assert len(m["epoch_losses"]) == 1 and math.isfinite(m["epoch_losses"][0]), m
        assert m["resumed_from"] is None, m
        # 32 steps of SGD at lr 0.1 on 2048 samples: well above chance (0.1), not yet good.
        assert 0.2 < m["test_accuracy"] <= 1.0, m
    assert re.search(r"test accuracy: 0\.\d+", pa.stdout), output(pa)
    # The snapshot's own parameter bytes hash to the reported checksum.
    _, _, _, fnv = read_snapshot(tmp_path / "a" / "s.ddp")
    assert fnv == checksum_value(a["param_checksum"]), (hex(fnv), a["param_checksum"])


# ------------------------------------------ 4. a rank killed mid-epoch, restarted, resumed

@needs_fmnist
def test_kill_and_resume_matches_uninterrupted(tmp_path):
    steps_per_epoch = SUBSET // (2 * 32)  # 32
    fault_step = 40  # mid epoch 1 (0-based), the second epoch
    # --recovery restart: the whole-job restart from a snapshot (in-place recovery:
    # test_live_recovery.py).
    common = ["--batch-size", "32", "--lr", "0.1", "--seed", "5", "--no-eval",
              "--recovery", "restart"]
    ref = ddprun(2, fm_args(3, 1, tmp_path / "ref.ddp", tmp_path / "ref.json", *common),
                 tmp_path)
    assert ref.returncode == 0, output(ref)
    r = read_metrics(tmp_path / "ref.json")
    assert r["resumed_from"] is None and r["steps"] == 3 * steps_per_epoch, r

    p = ddprun(2, fm_args(3, 1, tmp_path / "ft.ddp", tmp_path / "ft.json", *common), tmp_path,
               env={"DDP_TRAIN_FAULT": f"1:{fault_step}"}, launcher_args=["--max-restarts=1"],
               timeout=240)
    assert p.returncode == 0, output(p)
    assert "restart 1 of 1" in p.stderr, output(p)  # ddprun restarted the workers once
    assert "resum" in (p.stdout + p.stderr).lower(), output(p)
    f = read_metrics(tmp_path / "ft.json")
    assert f["resumed_from"] is not None, f
    # Rank 0 snapshots the last completed step when its peer dies mid-step: the restarted job
    # resumes at the fault, not at the end-of-epoch snapshot before it.
    rf = f["resumed_from"]
    resumed_at = rf["epoch"] * steps_per_epoch + rf["step"]
    assert rf["epoch"] == 1 and fault_step - 1 <= resumed_at <= fault_step + 1, (rf, output(p))

    assert checksum_value(f["param_checksum"]) == checksum_value(r["param_checksum"]), (f, r)
    assert f["final_loss"] == r["final_loss"], (f, r)
    assert f["epoch_losses"][-1] == r["epoch_losses"][-1], (f, r)  # epoch 2 ran whole in both
    hr, pr, _, fnv_r = read_snapshot(tmp_path / "ref.ddp")
    hf, pf, _, _ = read_snapshot(tmp_path / "ft.ddp")
    assert hr["global_step"] == hf["global_step"] == 3 * steps_per_epoch, (hr, hf)
    assert hr["epoch"] == hf["epoch"] == 3, (hr, hf)
    assert np.array_equal(pr, pf)
    assert fnv_r == checksum_value(r["param_checksum"]), (hex(fnv_r), r["param_checksum"])


# ------------------------------------------------------- 5. SIGUSR1 / SIGTERM snapshots

@needs_fmnist
def test_sigterm_saves_snapshot(tmp_path):
    steps_per_epoch = SUBSET // 32  # one rank, batch 32: 64
    snap = tmp_path / "sig.ddp"
    common = ["--batch-size", "32", "--lr", "0.1", "--seed", "9", "--no-eval"]
    args = fm_args(500, 0, snap, None, *common)  # SAVE_EVERY 0: snapshots only on signals
    out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = popen_retry([TRAIN, *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                           cwd=str(tmp_path), env=clean_env())

    def text():
        return f"--- stdout:\n{out_path.read_text()}\n--- stderr:\n{err_path.read_text()}"

    def wait_for(pred, timeout):
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline or proc.poll() is not None:
                return pred()
            time.sleep(0.05)
        return True

    try:
        progress = re.compile(r"\bepoch\s+\d+/\d+")
        assert wait_for(lambda: progress.search(out_path.read_text()), 90), \
            "no progress line (flushed to a non-terminal stdout) within 90 s\n" + text()
        assert proc.poll() is None, text()
        assert not snap.exists(), "SAVE_EVERY 0 wrote a snapshot before any signal"

        # SIGUSR1: a snapshot at the next step boundary, and training goes on.
        proc.send_signal(signal.SIGUSR1)
        assert wait_for(snap.exists, 30), "no snapshot 30 s after SIGUSR1\n" + text()
        time.sleep(0.2)
        assert proc.poll() is None, "SIGUSR1 stopped the run\n" + text()
        h1, _, _, _ = read_snapshot(snap)

        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("still running 30 s after SIGTERM\n" + text())
        assert rc == 143, text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    h, params, _, _ = read_snapshot(snap)
    assert h["model"] == "mlp" and h["world_size"] == 1 and h["batch_size"] == 32, h
    assert h["seed"] == 9, h
    assert 0 <= h["epoch"] < 500 and 0 <= h["step"] <= steps_per_epoch, h
    assert h["global_step"] == h["epoch"] * steps_per_epoch + h["step"] >= 1, h
    assert h["global_step"] >= h1["global_step"], (h1, h)

    # Resume: TOTAL_EPOCHS counts from the start of the job, so this runs only the rest of the
    # interrupted epoch.
    epoch, step = h["epoch"], h["step"]
    p = train(fm_args(epoch + 1, 0, snap, tmp_path / "m.json", *common), tmp_path)
    assert p.returncode == 0, output(p)
    assert "resum" in (p.stdout + p.stderr).lower(), output(p)
    m = read_metrics(tmp_path / "m.json")
    assert m["resumed_from"] == {"epoch": epoch, "step": step}, m
    hf, pf, _, _ = read_snapshot(snap)
    assert hf["epoch"] == epoch + 1 and hf["global_step"] == (epoch + 1) * steps_per_epoch, hf
    if step < steps_per_epoch:
        assert not np.array_equal(pf, params)


