"""Helpers shared by the ddp-train suites (test_ddp_train.py, test_ddp_train_variants.py): where
the binaries and Fashion-MNIST are, a snapshot parser that verifies its FNV-1a 64 checksum
independently of the trainer, and bounded runs of ddp-train alone or under ddprun."""
import json
import os
import signal
import struct
import subprocess

import numpy as np
import pytest

from support.pytest_tools import needs_tool

from conftest import BIN, popen_retry

TRAIN = os.path.join(BIN, "ddp-train")
DDPRUN = os.path.join(BIN, "ddprun")
FMNIST = "/usr/share/datasets/fashion-mnist"
FMNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                "t10k-labels-idx1-ubyte")

# Every test module of ddp-train carries this as its pytestmark.
needs_ddp_train = pytest.mark.skipif(not os.path.exists(TRAIN),
                                     reason=f"ddp-train not built at {TRAIN} (set DDP_BIN_DIR)")


def _have_fmnist():
    return all(os.path.exists(os.path.join(FMNIST, f)) or
               os.path.exists(os.path.join(FMNIST, f + ".gz")) for f in FMNIST_FILES)


needs_fmnist = needs_tool(_have_fmnist(),
                          f"the Fashion-MNIST IDX files in {FMNIST} (Debian's dataset-fashion-mnist)")

SUBSET = 2048
PARAM_COUNTS = {"mlp": 235146, "autoencoder": 234640, "linear": 21,  # from docs' layer tables
                "convnet": 1199882}


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

