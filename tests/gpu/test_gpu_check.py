"""scripts/gpu_check.sh (issue 37), the whole CUDA path in one command, tested where no GPU is:
its no-GPU exit path (77, every row of the table says why, within seconds, even with a GPU in the
machine when CUDA_VISIBLE_DEVICES hides it), its usage errors (2, the argument named), a missing
build named, and its self-test, which runs the same cuda-against-cpu pairs with the CPU path on
both sides: every pair passes, and a device-under-test that trains differently fails by name."""
import os
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "gpu_check.sh")
BUILD = os.path.dirname(os.path.abspath(
    os.environ.get("DDP_BIN_DIR", os.path.join(ROOT, "build-cuda", "bin"))))
CHECKS = ("GPU unit tests", "cuda = cpu (3 models x 4 sharding levels)", "bf16 trains",
          "memcheck", "kernel bench")


def check(*args, env=None, timeout=300):
    e = dict(os.environ, CUDA_VISIBLE_DEVICES="", **(env or {}))
    return subprocess.run(["bash", SCRIPT, "--no-build", "--build-dir", BUILD, *args], env=e,
                          capture_output=True, text=True, timeout=timeout)


def rows(out):
    table = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in CHECKS:
            table[cells[0]] = cells[1:]
    return table


def test_no_gpu_exits_77_with_every_check_named():
    t0 = time.monotonic()
    p = check()
    assert p.returncode == 77, p.stdout + p.stderr
    assert time.monotonic() - t0 < 60  # a bound, not a timing claim: nothing was run
    table = rows(p.stdout)
    assert sorted(table) == sorted(CHECKS), p.stdout
    for result, detail, _ in table.values():
        assert result == "skipped" and detail == "no CUDA device visible to this process"
    assert "nothing was checked" in p.stderr and "CUDA_VISIBLE_DEVICES=" in p.stderr


def test_usage_errors_are_named():
    for args, want in [(["--bogus"], "unknown argument '--bogus'"),
                       (["--steps", "1"], "--steps '1' is not a number in 2..200"),
                       (["--steps", "x"], "--steps 'x' is not a number in 2..200"),
                       (["--steps"], "--steps needs a number")]:
        p = check(*args)
        assert p.returncode == 2 and want in p.stderr, (args, p.stderr)


def test_a_missing_build_is_named(tmp_path):
    p = subprocess.run(["bash", SCRIPT, "--no-build", "--build-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert f"{tmp_path}/bin/ddp_gpu_tests is missing" in p.stderr


def test_self_test_runs_every_pair_and_sees_a_mismatch():
    p = check("--self-test", "--steps", "4")
    assert p.returncode == 0, p.stdout + p.stderr
    table = rows(p.stdout)
    result, detail, _ = table["cuda = cpu (3 models x 4 sharding levels)"]
    assert result == "passed", p.stdout
    # Fashion-MNIST feeds mlp and autoencoder: 12 pairs with it, the linear model's 4 without.
    fmnist = os.path.isdir(os.environ.get("DDP_FMNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    assert detail.startswith("12 pairs" if fmnist else "4 pairs"), detail
    assert "4 steps each" in detail
    # The device under test trains with another learning rate: every pair differs after step 0.
    bad = check("--self-test", "--steps", "4", env={"DDP_GPU_CHECK_SELF_TEST_ARGS": "--lr 0.5"})
    assert bad.returncode == 1, bad.stdout + bad.stderr
    result, detail, _ = rows(bad.stdout)["cuda = cpu (3 models x 4 sharding levels)"]
    assert result == "FAILED" and "> 1e-3" in detail, bad.stdout
    assert "linear-full: step " in bad.stderr, bad.stderr
