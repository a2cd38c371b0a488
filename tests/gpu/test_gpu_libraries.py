"""The CUDA build's GPU libraries, found at run time (issue 33), checked without a GPU: ddp-train
links neither cuBLAS nor NCCL nor a shared CUDA runtime; it finds them in the nvidia-* pip
packages that torch's CUDA wheels install (the torch venv that runs this suite), after
LD_LIBRARY_PATH, or where a DDPRUN_*_LIBRARY knob names them; a file that does not load, or one
that lacks a function, is named. In a minimal Debian 12 root without any CUDA library (debootstrap,
scripts/setup.sh), `--gpu-libraries` names both missing libraries and how to get them, and a
CPU job runs."""
import glob
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from pytest_tools import missing_tool  # noqa: E402

BIN = os.environ.get("DDP_BIN_DIR", os.path.join(HERE, "..", "..", "build-cuda", "bin"))
TRAIN = os.path.join(BIN, "ddp-train")
DEBROOT = os.environ.get("DDP_DEBROOT", os.path.expanduser("~/.cache/ddprun/bookworm-minbase"))
SITE = sysconfig.get_paths()["purelib"]  # this venv's: where torch's nvidia-* packages are
KNOBS = ("LD_LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH", "DDPRUN_CUBLAS_LIBRARY",
         "DDPRUN_NCCL_LIBRARY")


def env(**extra):
    e = {k: v for k, v in os.environ.items() if k not in KNOBS}
    e.update(extra)
    return e


def gpu_libraries(**extra):
    return subprocess.run([TRAIN, "--gpu-libraries"], capture_output=True, text=True, timeout=60,
                          env=env(**extra))


def pip_library(package, soname):
    """(version, file) of a library from an nvidia-* pip package of this venv."""
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        missing_tool(f"{package} in {sys.prefix} (torch's CUDA wheel brings it; scripts/setup.sh)")
    found = glob.glob(os.path.join(SITE, "nvidia", "*", "lib", soname))
    assert found, f"{package} {version} is installed but holds no {soname}"
    return version, found[0]


def test_no_gpu_library_is_linked():
    out = subprocess.run(["readelf", "-d", TRAIN], capture_output=True, text=True,
                         check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)
    assert needed, out
    assert not [n for n in needed if re.search(r"cudart|cublas|nccl|libcuda", n)], needed


def test_found_in_the_pip_packages_torch_installs():
    blas_version, blas = pip_library("nvidia-cublas", "libcublas.so.13")
    nccl_version, nccl = pip_library("nvidia-nccl-cu13", "libnccl.so.2")
    p = gpu_libraries(VIRTUAL_ENV=sys.prefix)
    assert p.returncode == 0, p.stdout + p.stderr
    short = ".".join(blas_version.split(".")[:3])  # the package's 4th number is a build
    assert f"cuBLAS {short}: {blas} (a pip package in {SITE})" in p.stdout, p.stdout
    assert f"NCCL {nccl_version}: {nccl} (a pip package in {SITE})" in p.stdout, p.stdout
    assert "CUDA runtime 13." in p.stdout and "(static, in this program)" in p.stdout


def test_ld_library_path_comes_first(tmp_path):
    _, blas = pip_library("nvidia-cublas", "libcublas.so.13")
    _, nccl = pip_library("nvidia-nccl-cu13", "libnccl.so.2")
    for f in (blas, os.path.join(os.path.dirname(blas), "libcublasLt.so.13"), nccl):
        os.symlink(f, tmp_path / os.path.basename(f))
    p = gpu_libraries(VIRTUAL_ENV=sys.prefix, LD_LIBRARY_PATH=f"/nonexistent:{tmp_path}")
    assert p.returncode == 0, p.stdout + p.stderr
    assert f": {tmp_path}/libcublas.so.13 (LD_LIBRARY_PATH)" in p.stdout, p.stdout
    assert f": {tmp_path}/libnccl.so.2 (LD_LIBRARY_PATH)" in p.stdout, p.stdout


def test_a_named_library_is_the_only_place_and_what_fails_is_named(tmp_path):
    _, blas = pip_library("nvidia-cublas", "libcublas.so.13")
    p = gpu_libraries(VIRTUAL_ENV=sys.prefix, DDPRUN_CUBLAS_LIBRARY=str(tmp_path / "nope.so"))
    assert p.returncode == 1, p.stdout + p.stderr
    assert (f"cuBLAS: missing: cuBLAS (libcublas.so.13) was not found; tried:\n"
            f"  {tmp_path}/nope.so (DDPRUN_CUBLAS_LIBRARY): no such file\n"
            f"DDPRUN_CUBLAS_LIBRARY names a file that does not load: fix or unset it") in p.stdout
    assert re.search(r"^NCCL 2\.\d+\.\d+: ", p.stdout, re.M), p.stdout  # the other one loads
    # A library that loads but is not NCCL: the missing function, with the file.
    p = gpu_libraries(DDPRUN_NCCL_LIBRARY=blas)
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"NCCL: missing: {blas} (NCCL) lacks ncclGetVersion: ddp-train needs NCCL 2.14" \
        in p.stdout, p.stdout


def test_a_bare_debian_root_names_what_is_missing_and_trains_on_the_cpu():
    if not os.path.isfile(os.path.join(DEBROOT, "usr/bin/python3")):
        missing_tool(f"a minimal Debian 12 root at {DEBROOT} (debootstrap; scripts/setup.sh)")
    if os.geteuid() != 0:
        missing_tool("root (chroot into the Debian root)")
    assert not glob.glob(os.path.join(DEBROOT, "usr/lib/x86_64-linux-gnu/libcublas*"))
    inside = f"/tmp/ddp-gpu-{uuid.uuid4().hex[:8]}"
    where = DEBROOT + inside
    os.makedirs(where + "/lib")
    try:
        # The non-GPU libraries the root lacks go beside it (what auditwheel does for a wheel).
        ldd = subprocess.run(["ldd", TRAIN], capture_output=True, text=True, check=True).stdout
        for path in re.findall(r"=> (/\S+) \(", ldd):
            if not os.path.exists(DEBROOT + path) and not os.path.exists(
                    DEBROOT + path.replace("/lib/", "/usr/lib/", 1)):
                shutil.copy(path, where + "/lib")
        shutil.copy(TRAIN, where)
        script = (f"LD_LIBRARY_PATH={inside}/lib {inside}/ddp-train --gpu-libraries; "
                  f"echo rc=$?; cd {inside} && LD_LIBRARY_PATH={inside}/lib {inside}/ddp-train "
                  "1 0 --model linear --dataset synthetic --synthetic-size 256 --threads 1 "
                  "--no-eval --device cpu")
        p = subprocess.run(["unshare", "-m", "sh", "-c",
                            f"mount -t proc proc {DEBROOT}/proc && "
                            f"exec chroot {DEBROOT} env -i PATH=/usr/bin:/bin sh -c \"$0\"",
                            script], capture_output=True, text=True, timeout=180)
        out = p.stdout + p.stderr
        assert "rc=1" in p.stdout, out
        assert "CUDA driver: none" in p.stdout, out
        assert "cuBLAS: missing: cuBLAS (libcublas.so.13) was not found" in p.stdout, out
        assert "pip install nvidia-cublas" in p.stdout, out
        assert "NCCL: missing: NCCL (libnccl.so.2) was not found" in p.stdout, out
        assert "pip install nvidia-nccl-cu13" in p.stdout, out
        assert p.returncode == 0, out  # the CPU job, without any GPU library
    finally:
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture(autouse=True)
def _built():
    if not os.access(TRAIN, os.X_OK):
        pytest.fail(f"{TRAIN} is not built")
