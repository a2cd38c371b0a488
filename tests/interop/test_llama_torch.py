"""ddp-train --model llama against PyTorch 2.15's own tensor parallelism and FSDP2 (issue 20):
tests/reference/llama_reference.py builds the same decoder (the seed's llama2_model.py at byte
vocabulary) from the same initial values, on the same batches of the same text, and trains it
under torchrun with DTensor's parallelize_module (ColwiseParallel / RowwiseParallel) on the tp
mesh and fully_shard on the dp mesh, on the CPU over gloo. For one rank, tp=2, dp=2 and dp=2,tp=2
the step losses and the final weights (sum and sum of squares) must agree with ddp-train's at the
same mesh within 1e-4 relative (the sums' order and libm differ, nothing else), and the initial
values must be the same numbers. Bounded: a tiny model, 6 steps, timeouts on every run."""
import json
import os
import struct
import sys

import pytest

from ddp_train_helpers import DDPRUN, TRAIN, clean_env, needs_ddp_train, output, run_bounded

pytestmark = [needs_ddp_train]

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "reference", "llama_reference.py")
SIZES = ["--dim", "32", "--n-layers", "2", "--n-heads", "4", "--seq-len", "32", "--eval-seqs",
         "8", "--optimizer", "adamw", "--lr", "3e-3", "--seed", "7"]
STEPS = 6
GLOBAL_BATCH = 8
ENV = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "10", "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}

pytest.importorskip("torch")


def torch_run(world, mesh, level, tmp_path, tag):
    out = tmp_path / f"torch-{tag}.json"
    dp = world // (2 if "tp=2" in mesh else 1)
    args = [*SIZES, "--steps", str(STEPS), "--batch-size", str(GLOBAL_BATCH // dp), "--mesh",
            mesh, "--sharding", level, "--out", str(out)]
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world}", REFERENCE, *args]
    p = run_bounded(argv, str(tmp_path), clean_env(ENV), 240)
    assert p.returncode == 0, output(p)
    with open(out) as f:
        return json.load(f)


def ddp_run(world, mesh, level, tmp_path, tag):
    out = tmp_path / f"cpp-{tag}.json"
    dp = world // (2 if "tp=2" in mesh else 1)
    args = ["1", "0", "--model", "llama", *SIZES, "--epoch-steps", str(STEPS), "--batch-size",
            str(GLOBAL_BATCH // dp), "--mesh", mesh, "--sharding", level, "--snapshot", "",
            "--metrics-json", str(out)]
    argv = [DDPRUN, "--standalone", f"--nproc-per-node={world}", "--no-python", TRAIN, *args]
    p = run_bounded(argv, str(tmp_path), clean_env(ENV), 240)
    assert p.returncode == 0, output(p)
    with open(out) as f:
        return json.load(f)


def max_rel(a, b):
    assert len(a) == len(b), (a, b)
    return max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))


@pytest.mark.parametrize("world,mesh,level", [
    (1, "dp=1,tp=1", "none"),
    (2, "tp=2", "none"),
    (2, "dp=2", "full"),
    (4, "dp=2,tp=2", "full"),
])
def test_matches_pytorch_tensor_parallel_and_fsdp2(tmp_path, world, mesh, level):
    tag = f"{world}-{level}"
    ref = torch_run(world, mesh, level, tmp_path, tag)
    got = ddp_run(world, mesh, level, tmp_path, tag)
    assert len(got["step_losses"]) == STEPS
    rel = max_rel(ref["step_losses"], got["step_losses"])
    print(f"{mesh} {level}: step losses within {rel:.2e} relative of PyTorch's")
    assert rel < 1e-4, (ref["step_losses"], got["step_losses"])
    assert max_rel(ref["fingerprint"], got["fingerprint"]) < 1e-4, \
        (ref["fingerprint"], got["fingerprint"])
    assert got["step_losses"][-1] < got["step_losses"][0]  # it trains


def test_initial_values_are_the_same_numbers(tmp_path):
    """--steps 0 --write-params: the reference's canonical initial vector; ddp-train's initial
    fingerprint (0 epochs) must equal its sum and sum of squares."""
    raw = tmp_path / "init.f32"
    argv = [sys.executable, REFERENCE, *SIZES, "--steps", "0", "--batch-size", "8",
            "--write-params", str(raw), "--out", str(tmp_path / "init.json")]
    p = run_bounded(argv, str(tmp_path), clean_env(ENV), 120)
    assert p.returncode == 0, output(p)
    data = raw.read_bytes()
    values = struct.unpack(f"<{len(data) // 4}f", data)
    s = sum(float(v) for v in values)
    sq = sum(float(v) * float(v) for v in values)
    out = tmp_path / "cpp-init.json"
    args = ["0", "0", "--model", "llama", *SIZES, "--batch-size", "8", "--snapshot", "", "--metrics-json", str(out)]
    p = run_bounded([TRAIN, *args], str(tmp_path), clean_env(ENV), 120)  # 0 epochs: the init
    assert p.returncode == 0, output(p)
    with open(out) as f:
        got = json.load(f)
    assert got["params"] == len(values) and got["steps"] == 0
    # The same draws: libm's log and cos may differ by an ulp between numpy and glibc.
    assert abs(got["fingerprint"][0] - s) <= 1e-6 * max(1.0, abs(s)), (got["fingerprint"], s)
    assert abs(got["fingerprint"][1] - sq) <= 1e-6 * sq, (got["fingerprint"], sq)
