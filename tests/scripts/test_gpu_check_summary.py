"""scripts/gpu_check_summary.py, the judgements of scripts/gpu_check.sh that read files, tested
without a GPU: the kernel bench's rows summed up (the figures a real H200 run gave), a row file
that is not kernel_bench's named; bf16 against fp32 passing when it tracks and falls, failing by
name when it drifts, does not fall, has a NaN or too few steps. Pure: files in tmp_path only."""
import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                      "gpu_check_summary.py")

# kernel_bench --json on an H200 (2026-11-30), three of its rows.
KERNELS = [{"kernel": "cudaMemcpy device to device", "gbps": 4188.6, "of_copy": 1.0},
           {"kernel": "scale", "gbps": 3100.1, "of_copy": 0.7401},
           {"kernel": "bf16_to_f32", "gbps": 2624.1, "of_copy": 0.6265}]


def summary(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True,
                          text=True, timeout=60)


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_kernels_line_names_the_slowest_kernel(tmp_path):
    p = summary("kernels", write(tmp_path, "k.json", KERNELS))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "2 kernels; lowest 63% of copy bandwidth (bf16_to_f32)"


@pytest.mark.parametrize("rows", [[], KERNELS[:1], {"kernel": "scale"},
                                  [{"kernel": "x", "gbps": 1.0}] * 2])
def test_kernels_rejects_what_is_not_the_bench_rows(tmp_path, rows):
    p = summary("kernels", write(tmp_path, "k.json", rows))
    assert p.returncode == 1
    assert "not kernel_bench's rows" in p.stdout


def test_kernels_names_a_missing_file(tmp_path):
    p = summary("kernels", tmp_path / "none.json")
    assert p.returncode == 1 and "none.json" in p.stdout


FP32 = [2.30, 2.20, 2.00, 1.90, 1.70, 1.60, 1.50, 1.45]


def bf16(tmp_path, fp32, low, *flags, steps=8):
    a = write(tmp_path, "fp32.json", {"step_losses": fp32})
    b = write(tmp_path, "bf16.json", {"step_losses": low})
    return summary("bf16", a, b, steps, *flags)


def test_bf16_that_tracks_fp32_and_falls_passes(tmp_path):
    p = bf16(tmp_path, FP32, [x * 1.01 for x in FP32], "--falls")
    assert p.returncode == 0, p.stdout
    assert "apart" in p.stdout and "(means of 2 steps)" in p.stdout


def test_bf16_far_from_fp32_fails_by_name(tmp_path):
    p = bf16(tmp_path, FP32, [x * 1.2 for x in FP32])
    assert p.returncode == 1
    assert "from fp32, more than 10%" in p.stdout


def test_bf16_that_does_not_fall_fails_only_when_asked(tmp_path):
    flat = [1.0] * 8
    assert bf16(tmp_path, flat, flat).returncode == 0  # synthetic data: no fall asked
    p = bf16(tmp_path, flat, flat, "--falls")
    assert p.returncode == 1 and "did not train" in p.stdout


@pytest.mark.parametrize("low,why", [([float("nan")] + FP32[1:], "not finite"),
                                     (FP32[:5], "5 step losses, not 8")])
def test_bf16_nan_or_missing_steps_fail_by_name(tmp_path, low, why):
    p = bf16(tmp_path, FP32, low, "--falls")
    assert p.returncode == 1 and why in p.stdout


def test_bad_usage_exits_2():
    for args in ([], ["kernels"], ["bf16", "a", "b", "x"], ["bf16", "a", "b", "8", "--fall"]):
        assert summary(*args).returncode == 2
