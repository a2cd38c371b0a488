"""ddp-train (docs/ddp_train.md), the built-in C++ data-parallel trainer, run as users run it:
under ddprun (--no-python: it is a program, not a script) and alone (no RANK: world size 1).

Covered: N ranks with batch B/N take the same steps as one rank with batch B (SGD and Adam),
gradient accumulation equals the big batch, same seed same run, a rank SIGKILLed mid-epoch
under `ddprun --max-restarts=1` resumes to the very parameters of an uninterrupted run,
SIGUSR1/SIGTERM snapshots and resuming from them, exit codes and error messages for bad
inputs (and ddprun's failure summary for them), and the autoencoder model.

Every run is small (--train-subset 2048, --threads 1: seconds on 2 cores), works in tmp_path
(the default snapshot path is relative to the working directory, and a snapshot found at start
is resumed from, so every run names its own), and is bounded by a timeout. Snapshots are parsed
and their FNV-1a 64 checksum verified here, independently of the trainer.
"""
import glob
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import BIN, popen_retry

TRAIN = os.path.join(BIN, "ddp-train")
DDPRUN = os.path.join(BIN, "ddprun")
FMNIST = "/usr/share/datasets/fashion-mnist"
FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                "t10k-labels-idx1-ubyte")

pytestmark = pytest.mark.skipif(not os.path.exists(TRAIN),
                                reason=f"ddp-train not built at {TRAIN} (set DDP_BIN_DIR)")


def _have_fmnist():
    return all(os.path.exists(os.path.join(FMNIST, f)) or
               os.path.exists(os.path.join(FMNIST, f + ".gz")) for f in FMNIST_FILES)


needs_fmnist = pytest.mark.skipif(not _have_fmnist(),
                                  reason=f"Fashion-MNIST IDX files not found in {FMNIST}")

SUBSET = 2048
PARAM_COUNTS = {"mlp": 235146, "autoencoder": 234640, "linear": 21}  # from docs' layer tables


# ----------------------------------------------------------------------------------- snapshots

FNV_OFFSET, FNV_PRIME, U64 = 0xcbf29ce484222325, 0x100000001b3, (1 << 64) - 1


def fnv1a64(data):
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & U64
    return h


def read_snapshot(path):
    """Parses a snapshot as docs/ddp_train.md lays it out and checks every part of it: magic,
    header length, JSON header, sizes, and the trailing FNV-1a 64 of all bytes before it.
    Returns (header, params, opt_state, params_fnv): float32 numpy arrays, and the FNV-1a 64 of
    the parameter bytes alone (what --metrics-json calls param_checksum)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"DDPSNAP1", f"{path}: bad magic {data[:8]!r}"
    (hlen,) = struct.unpack_from("<I", data, 8)
    assert 12 + hlen <= len(data), f"{path}: header length {hlen} past the end ({len(data)})"
    header = json.loads(data[12:12 + hlen].decode())
    for key in ("model", "params", "optimizer", "opt_state", "epoch", "step", "global_step",
                "seed", "lr", "adam_t", "world_size", "batch_size"):
        assert key in header, f"{path}: header lacks {key!r}: {header}"
    n, m = header["params"], header["opt_state"]
    off = 12 + hlen
    assert len(data) == off + 4 * (n + m) + 8, \
        f"{path}: {len(data)} bytes, expected {off + 4 * (n + m) + 8} for {n} + {m} floats"
    (stored,) = struct.unpack_from("<Q", data, len(data) - 8)
    computed = fnv1a64(data[:-8])
    assert stored == computed, f"{path}: checksum {stored:#x} != FNV-1a 64 {computed:#x}"
    params = np.frombuffer(data, dtype="<f4", count=n, offset=off).copy()
    opt = np.frombuffer(data, dtype="<f4", count=m, offset=off + 4 * n).copy()
    if header["model"] in PARAM_COUNTS:
        assert n == PARAM_COUNTS[header["model"]], header
    assert np.all(np.isfinite(params)), f"{path}: non-finite parameters"
    return header, params, opt, fnv1a64(data[off:off + 4 * n])


def read_metrics(path):
    with open(path) as f:
        return json.load(f)


def checksum_value(text):
    """param_checksum is documented as hex: accept '0x...' or bare digits."""
    return int(str(text), 16)


# ------------------------------------------------------------------------------------ running

LAUNCH_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR",
               "MASTER_PORT", "DDP_TRAIN_FAULT"}


def clean_env(extra=None):
    """This process's environment without any launcher contract (a direct run must be world
    size 1 even if pytest itself was started by a launcher) or a leftover fault injection."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCH_VARS and not k.startswith("TORCHELASTIC_")}
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


def run_bounded(argv, cwd, env, timeout):
    p = popen_retry(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL, text=True, cwd=str(cwd), env=env)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)  # ddprun stops its workers on SIGTERM
        try:
            out, err = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
        pytest.fail(f"{' '.join(argv)} did not finish in {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def train(args, cwd, env=None, timeout=120):
    """ddp-train alone: no RANK in its environment, so one process, world size 1."""
    return run_bounded([TRAIN, *args], cwd, clean_env(env), timeout)


def ddprun(nproc, args, cwd, env=None, launcher_args=(), timeout=180):
    """ddp-train under `ddprun --standalone --nproc-per-node=N --no-python`."""
    argv = [DDPRUN, "--standalone", f"--nproc-per-node={nproc}", *launcher_args, "--no-python",
            TRAIN, *args]
    # A bounded grace for workers ddprun stops, so nothing can stall a test for 30 s.
    e = clean_env({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "10", **(env or {})})
    return run_bounded(argv, cwd, e, timeout)


def output(p):
    return f"--- exit {p.returncode}\n--- stdout:\n{p.stdout}\n--- stderr:\n{p.stderr}"


def fm_args(epochs, save_every, snapshot, metrics=None, *opts, subset=SUBSET):
    """Options first, then TOTAL_EPOCHS SAVE_EVERY, as in the documented synopsis."""
    a = ["--data", FMNIST, "--train-subset", str(subset), "--threads", "1",
         "--snapshot", str(snapshot)]
    if metrics is not None:
        a += ["--metrics-json", str(metrics)]
    return [*a, *opts, str(epochs), str(save_every)]


def summary_block(stderr):
    """torchrun's failure summary: from the first '====' rule on."""
    start = stderr.find("=" * 60)
    assert start >= 0, "no failure summary in:\n" + stderr
    return stderr[start:]


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
    common = ["--batch-size", "32", "--lr", "0.1", "--seed", "5", "--no-eval"]
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


# ------------------------------------------------------------------------- 6. bad inputs

@pytest.mark.parametrize("bad", [
    ["--model", "resnet"],
    ["--optimizer", "rmsprop"],
    ["--batch-size", "abc"],
    ["--grad-accum", "0"],
    ["--lr", "fast"],
    ["--backend", "nccl"],  # until the GPU path lands (issue 6)
    ["--backend", "mpi"],
])
def test_bad_option_exits_2_naming_it(tmp_path, bad):
    p = train(["--dataset", "synthetic", "--snapshot", str(tmp_path / "s.ddp"), *bad, "1", "0"],
              tmp_path, timeout=60)
    assert p.returncode == 2, output(p)
    assert bad[0] in p.stdout + p.stderr, output(p)
    assert not (tmp_path / "s.ddp").exists()


def test_missing_positional_is_a_usage_error(tmp_path):
    p = train(["--dataset", "synthetic", "--snapshot", str(tmp_path / "s.ddp"), "1"], tmp_path,
              timeout=60)
    assert p.returncode == 2, output(p)


def test_missing_data_dir_is_a_caught_error(tmp_path):
    missing = tmp_path / "no-such-dataset"
    p = train(["--data", str(missing), "--snapshot", str(tmp_path / "s.ddp"), "1", "0"],
              tmp_path, timeout=60)
    assert p.returncode == 1, output(p)
    assert str(missing) in p.stdout + p.stderr, output(p)


@pytest.mark.parametrize("damage", ["garbage", "bitflip", "truncated"])
def test_corrupt_snapshot_is_an_error_naming_it(tmp_path, damage):
    snap = tmp_path / "s.ddp"
    common = ["--dataset", "synthetic", "--threads", "1", "--snapshot", str(snap)]
    if damage == "garbage":
        snap.write_bytes(b"this is not a snapshot\n" * 40)
    else:
        p = train([*common, "--max-steps", "1", "1", "0"], tmp_path, timeout=60)
        assert p.returncode == 0, output(p)
        header, _, _, _ = read_snapshot(snap)
        assert header["model"] == "linear" and header["global_step"] == 1, header
        data = bytearray(snap.read_bytes())
        if damage == "bitflip":
            data[len(data) - 8 - 4 * (header["opt_state"] + 1)] ^= 0x10  # the last parameter
        else:
            del data[-20:]
        snap.write_bytes(bytes(data))
    p = train([*common, "2", "0"], tmp_path, timeout=60)
    assert p.returncode != 0, output(p)
    assert str(snap) in p.stdout + p.stderr or snap.name in p.stdout + p.stderr, output(p)


@needs_fmnist
def test_snapshot_of_another_model_is_an_error(tmp_path):
    snap = tmp_path / "s.ddp"
    p = train(["--dataset", "synthetic", "--threads", "1", "--snapshot", str(snap),
               "--max-steps", "1", "1", "0"], tmp_path, timeout=60)
    assert p.returncode == 0, output(p)
    p = train(fm_args(1, 0, snap, None, "--no-eval"), tmp_path)  # mlp on a linear snapshot
    assert p.returncode != 0, output(p)
    assert str(snap) in p.stdout + p.stderr or snap.name in p.stdout + p.stderr, output(p)


def test_failing_worker_under_ddprun_reports_its_error(tmp_path):
    missing = tmp_path / "no-such-dataset"
    logs = tmp_path / "logs"
    p = ddprun(2, ["--data", str(missing), "--snapshot", str(tmp_path / "s.ddp"), "1", "0"],
               tmp_path, launcher_args=[f"--log-dir={logs}"], timeout=120)
    assert p.returncode == 1, output(p)
    summary = summary_block(p.stderr)
    assert "error_file: <N/A>" not in summary, summary  # the worker wrote its error file ...
    assert str(missing) in summary, summary  # ... and its message is the reported cause
    files = glob.glob(str(logs / "*" / "attempt_0" / "*" / "error.json"))
    assert files, (os.listdir(logs) if logs.exists() else "no log dir", summary)
    assert any(str(missing) in open(f).read() for f in files), files


# ---------------------------------------------------------------------- 7. the autoencoder

@needs_fmnist
def test_autoencoder_runs(tmp_path):
    # Adam: plain SGD barely moves a sigmoid autoencoder in 32 steps (MSE stays ~0.17, the
    # "predict 0.5" level); Adam at 3e-3 gets to ~0.06 (the mean image alone gives ~0.087).
    p = ddprun(2, fm_args(1, 0, tmp_path / "ae.ddp", tmp_path / "m.json", "--model",
                          "autoencoder", "--optimizer", "adam", "--lr", "3e-3", "--seed", "1"),
               tmp_path)
    assert p.returncode == 0, output(p)
    m = read_metrics(tmp_path / "m.json")
    assert m["model"] == "autoencoder" and m["world_size"] == 2, m
    mse = m["test_mse"]
    assert isinstance(mse, float) and math.isfinite(mse) and 0 <= mse < 0.1, m
    assert "test mse:" in p.stdout, output(p)
    h, _, _, _ = read_snapshot(tmp_path / "ae.ddp")
    assert h["model"] == "autoencoder" and h["optimizer"] == "adam", h


# ------------------------------------- 8. the same job under torchrun, and without shared memory

@needs_fmnist
def test_same_bits_under_torchrun_ddprun_and_gloo_alone(tmp_path):
    """ddp-train is a worker like any other: torch's own torchrun (its agent store is torch's
    TCPStore server) runs it too. With 2 ranks the shared-memory and Gloo sums are the same
    IEEE additions, so all three runs end with identical parameters."""
    def args(work):
        return fm_args(1, 0, work / "s.ddp", work / "m.json", "--lr", "0.1", "--seed", "5",
                       "--no-eval")

    runs = {}
    for name in ("ddprun", "torchrun", "gloo"):
        work = tmp_path / name
        work.mkdir()
        if name == "torchrun":
            argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2", "--no-python", TRAIN, *args(work)]
            p = run_bounded(argv, work, clean_env(), 240)
        elif name == "gloo":
            p = ddprun(2, args(work), work, env={"DDP_SHM_ALLREDUCE": "0"})
        else:
            # No --no-python: ddprun sees a compiled program and runs it directly.
            argv = [DDPRUN, "--standalone", "--nproc-per-node=2", TRAIN, *args(work)]
            p = run_bounded(argv, work, clean_env(), 180)
        assert p.returncode == 0, output(p)
        runs[name] = (p, read_metrics(work / "m.json"))
    backends = {n: re.search(r"backend ([^\s,]+)", p.stdout + p.stderr) for n, (p, _) in runs.items()}
    assert backends["ddprun"] and backends["ddprun"].group(1) == "gloo+shm", output(runs["ddprun"][0])
    assert backends["torchrun"] and backends["torchrun"].group(1) == "gloo+shm"
    assert backends["gloo"] and backends["gloo"].group(1) == "gloo", output(runs["gloo"][0])
    sums = {n: checksum_value(m["param_checksum"]) for n, (_, m) in runs.items()}
    assert len(set(sums.values())) == 1, sums
    assert runs["torchrun"][1]["world_size"] == 2


def test_tutorial_spelling_of_batch_size(tmp_path):
    """The tutorials' script takes --batch_size; both spellings work."""
    p = train(["--dataset", "synthetic", "--batch_size", "16", "--snapshot", "",
               "--metrics-json", str(tmp_path / "m.json"), "1", "1"], tmp_path)
    assert p.returncode == 0, output(p)
    m = read_metrics(tmp_path / "m.json")
    assert m["batch_size"] == 16 and m["model"] == "linear", m
    assert m["steps"] == 2048 // 16, m


# ----------------------------------------------- 9. the GPU path against the CPU path (GPU only)

def _cuda_usable():
    """ddp-train itself says whether it can run on a GPU here: built with CUDA and a device."""
    try:
        p = subprocess.run([TRAIN, "--device", "cuda", "--dataset", "synthetic", "--snapshot", "",
                            "--max-steps", "1", "--no-eval", "1", "0"],
                           capture_output=True, text=True, timeout=120, env=clean_env())
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0


@needs_fmnist
def test_gpu_steps_match_the_cpu_path(tmp_path):
    if not _cuda_usable():
        pytest.skip("no GPU here, or a build without CUDA: the GPU path did not run")
    runs = {}
    for device in ("cpu", "cuda"):
        work = tmp_path / device
        work.mkdir()
        # One rank: the test GPU machine has one GPU, and NCCL refuses two ranks on one device.
        p = ddprun(1, fm_args(1, 0, work / "s.ddp", work / "m.json", "--lr", "0.05",
                              "--momentum", "0.9", "--device", device, "--max-steps", "20"), work)
        assert p.returncode == 0, output(p)
        runs[device] = read_metrics(work / "m.json")
        assert f"device {device}" in p.stdout, output(p)
    c, g = runs["cpu"], runs["cuda"]
    assert abs(c["final_loss"] - g["final_loss"]) <= 1e-3 * max(1.0, abs(c["final_loss"])), (c, g)
    assert abs(c["test_accuracy"] - g["test_accuracy"]) <= 0.01, (c, g)


def test_bad_shm_switch_is_named(tmp_path):
    """DDP_SHM_ALLREDUCE is 0 or 1; anything else is refused before any communication."""
    p = train(["--dataset", "synthetic", "--snapshot", "", "1", "0"], tmp_path,
              env={"DDP_SHM_ALLREDUCE": "yes"})
    assert p.returncode == 2, output(p)
    assert "DDP_SHM_ALLREDUCE='yes'" in p.stderr, output(p)
