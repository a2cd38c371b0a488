"""The install suite's parts (issue 33): the built packages (scripts/build_packages.sh puts them
in dist/: the repaired wheel and the .deb), a fresh venv per test made with Debian's python3,
and the minimal Debian 12 root that scripts/setup.sh makes with debootstrap. A package that was
not built, or a missing root, is a missing tool (a failure under scripts/test.sh)."""
import glob
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from pytest_tools import missing_tool  # noqa: E402

DIST = os.environ.get("DDP_DIST_DIR", os.path.join(ROOT, "dist"))
DEBROOT = os.environ.get("DDP_DEBROOT",
                         os.path.expanduser("~/.cache/ddprun/bookworm-minbase"))
TORCH_PYTHON = os.environ.get("DDP_TORCH_PYTHON",
                              os.path.expanduser("~/.cache/ddprun/torch-venv/bin/python"))


def project_version():
    import re
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    return re.search(r"project\(ddprun VERSION (\d+\.\d+\.\d+)", text).group(1)


def one(pattern, what):
    found = sorted(glob.glob(os.path.join(DIST, pattern)))
    if not found:
        missing_tool(f"{what} in {DIST} (scripts/build_packages.sh builds it)")
    return found[-1]


@pytest.fixture(scope="session")
def wheel():
    return one("ddprun-*-py3-none-manylinux_*.whl", "the repaired wheel")


@pytest.fixture(scope="session")
def deb():
    return one("ddprun_*.deb", "the Debian package")


@pytest.fixture
def venv(tmp_path, wheel):
    """A fresh venv with the wheel installed from the file (no index, no build tools in it)."""
    v = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(v)], check=True, timeout=120)
    p = subprocess.run([str(v / "bin" / "pip"), "install", "--no-index", "--no-deps", "-q",
                        wheel], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return v


def bare_env(**extra):
    """An environment without the developer's venvs or build trees on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHON_EXEC", "PYTHONPATH", "DDP_BIN_DIR")}
    env["PATH"] = "/usr/bin:/bin"
    env.update(extra)
    return env
