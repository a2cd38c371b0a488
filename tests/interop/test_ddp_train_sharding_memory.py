"""ddp-train's --sharding levels and memory (issue 19): rank 0's `state_bytes_peak` (the trainer's
exact accounting of parameters + gradients + optimizer state held at once, gathered layers and
unsharded gradient buffers included) falls as 1/N under full sharding, and a model that does not
fit replicated under a per-process memory limit trains with full sharding under the same limit.

1. test_full_sharding_state_falls_with_world_size: 784-512x16-10 (P = 4,346,890; Adam: 16 bytes
   a parameter, 16 P = 66.3 MiB) for 2 steps at N = 1, 2, 4. Full sharding must hold at most
   16 P / N + SLACK_LAYERS of the largest layer (+ one float per layer and buffer for uneven
   parts): what is gathered or unsharded at once is bounded by the order of the collective
   thread's queue (measured: exactly 4 layers: the layer in use, the next one prefetched, its
   gradients and the previous layer's still being reduce-scattered), never by scheduling. And
   the peak strictly falls with N. At N = 4 the other levels are ordered full < gradients <
   none and optimizer < none: none holds 4 P floats exactly; optimizer the full parameters and
   gradients and its shard of Adam's m and v (2.5 P, 2.75 P with the parameter shard it is
   handed at start; measured 45.6 MiB = 2.75 P); gradients the full parameters, its shards of
   the gradients and of Adam's state (1.75 P) and each layer's unsharded gradients until that
   layer's reduce-scatter, which the collective thread runs without back-pressure: how many
   layers' gradients are alive at once depends on scheduling, up to all of them (+ P). So
   gradients < optimizer is typical (measured 41.6 MiB = 2.51 P: 12 of 17 layers' gradients at
   once) but not guaranteed, and is not asserted.
2. test_full_sharding_fits_where_replicated_does_not: 784-1024x32-10 (P = 33,351,690; 16 P =
   508.9 MiB) at N = 4, each worker started by a wrapper that sets RLIMIT_DATA (private writable
   memory: brk and anonymous mmaps, which is where glibc puts the large vectors) to LIMIT_MIB =
   448 MiB and execs ddp-train. Measured on this machine with the same options and bisected
   limits: --sharding none needs between 650 and 700 MiB of RLIMIT_DATA (state_bytes_peak
   508.9 MiB, VmHWM 608 MiB unlimited), so it fails with std::bad_alloc while allocating the
   model (its state alone is over the limit); --sharding full needs between 275 and 300 MiB
   (state_bytes_peak 143.2 MiB, VmHWM 226 MiB) and trains. The limit leaves ~150 MiB either side.
   Below ~275 MiB full sharding fails too, and can hang: OpenBLAS 0.3.21's blas_memory_alloc
   retries a failed malloc forever (OpenBLAS issue 5289, fixed in 0.3.30), which is why the
   runs are bounded.

Every run is small (--train-subset 256, --no-eval, --max-steps 2, one BLAS thread) and bounded.
Runtime: about 15 s on 2 cores.
"""
import math
import subprocess
import sys

import pytest

from ddp_train_helpers import (DDPRUN, FMNIST, TRAIN, clean_env, needs_ddp_train, needs_fmnist,
                               output, read_metrics, run_bounded)

pytestmark = [needs_ddp_train, needs_fmnist]

MIB = 1 << 20
SLACK_LAYERS = 6
LIMIT_MIB = 448
COMMON = ["--data", FMNIST, "--train-subset", "256", "--batch-size", "32", "--optimizer", "adam",
          "--threads", "1", "--snapshot", "", "--no-eval", "--max-steps", "2"]

# Sets RLIMIT_DATA, then becomes the program: argv = LIMIT_BYTES PROGRAM ARGS...
WRAPPER = """import os, resource, sys
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
os.execv(sys.argv[2], sys.argv[2:])
"""


def mlp_slots(hidden, layers, inputs=784, classes=10):
    """Floats of each layer (weight + bias) of 784-H-...-H-10."""
    dims = [inputs] + [hidden] * layers + [classes]
    return [a * b + b for a, b in zip(dims, dims[1:])]


def launch(tmp_path, nproc, args, wrap=(), timeout=240):
    """ddprun --standalone --no-python [WRAP...] ddp-train ARGS, bounded; stops its workers
    after 10 s of grace when it must stop them."""
    argv = [DDPRUN, "--standalone", f"--nproc-per-node={nproc}", "--no-python", *wrap, TRAIN,
            *args]
    env = clean_env({"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "10"})
    return run_bounded(argv, tmp_path, env, timeout)


def state_peak(tmp_path, nproc, level, hidden, layers, wrap=()):
    metrics = tmp_path / f"m-{nproc}-{level}.json"
    p = launch(tmp_path, nproc, [*COMMON, "--hidden", str(hidden), "--layers", str(layers),
                                 "--sharding", level, "--metrics-json", str(metrics), "1", "0"],
               wrap)
    assert p.returncode == 0, output(p)
    m = read_metrics(metrics)
    assert m["sharding"] == level and m["world_size"] == nproc, m
    assert m["steps"] == 2 and all(math.isfinite(x) for x in m["step_losses"]), m
    return m


def test_full_sharding_state_falls_with_world_size(tmp_path):
    hidden, layers = 512, 16
    slots = mlp_slots(hidden, layers)
    p = sum(slots)
    assert p == 4346890
    slack = SLACK_LAYERS * 4 * max(slots) + 4 * 4 * len(slots)
    peaks = {}
    for n in (1, 2, 4):
        peaks[n] = state_peak(tmp_path, n, "full", hidden, layers)["state_bytes_peak"]
        bound = 16 * p / n + slack
        assert 16 * p / n <= peaks[n] <= bound, \
            (f"N={n}: full sharding held {peaks[n] / MIB:.2f} MiB, outside "
             f"[16P/N = {16 * p / n / MIB:.2f}, +{SLACK_LAYERS} layers = {bound / MIB:.2f}] MiB")
    assert peaks[1] > peaks[2] > peaks[4], peaks
    at4 = {lv: state_peak(tmp_path, 4, lv, hidden, layers)["state_bytes_peak"]
           for lv in ("none", "optimizer", "gradients")}
    assert at4["none"] == 16 * p, at4
    assert 4 * (2 * p + 2 * p / 4) <= at4["optimizer"] < at4["none"], at4
    assert 4 * (p + 3 * p / 4) <= at4["gradients"] < at4["none"], at4
    assert peaks[4] < at4["gradients"], (peaks[4], at4)

def _sanitized(binary):
    """A sanitizer build maps terabytes of shadow memory and keeps freed memory in quarantine:
    no memory limit means there what it means for the real binary."""
    try:
        out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "libasan" in out or "libtsan" in out


@pytest.mark.skipif(_sanitized(TRAIN), reason="ddp-train is a sanitizer build: memory limits "
                    "do not apply to it as to the real binary")
def test_full_sharding_fits_where_replicated_does_not(tmp_path):
    hidden, layers, nproc = 1024, 32, 4
    p = sum(mlp_slots(hidden, layers))
    limit = LIMIT_MIB * MIB
    assert 16 * p > limit > 16 * p / nproc, "the limit must sit between none's and full's state"
    wrapper = tmp_path / "rlimit_data.py"
    wrapper.write_text(WRAPPER)
    wrap = (sys.executable, str(wrapper), str(limit))
    args = [*COMMON, "--hidden", str(hidden), "--layers", str(layers)]

    metrics = tmp_path / "none.json"
    p_none = launch(tmp_path, nproc, [*args, "--sharding", "none", "--metrics-json",
                                      str(metrics), "1", "0"], wrap, timeout=120)
    text = p_none.stdout + p_none.stderr
    assert p_none.returncode != 0, "replicated training fit under the limit:\n" + output(p_none)
    assert "bad_alloc" in text or "memory" in text.lower(), output(p_none)
    assert not metrics.exists()

    m = state_peak(tmp_path, nproc, "full", hidden, layers, wrap)
    assert m["state_bytes_peak"] < limit, m
    assert math.isfinite(m["final_loss"]), m
    assert m["state_bytes_peak"] <= 16 * p / nproc + SLACK_LAYERS * 4 * (hidden * hidden + hidden)
