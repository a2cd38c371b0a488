"""Bounds for the hostile tests (issue 14): every attack runs with resource limits on the
process it attacks, a timeout, bounded counts, and files only on a small private tmpfs (the
suite runs in its own mount namespace, tests/hostile/run.sh) or under RLIMIT_FSIZE."""
import os
import resource
import socket
import subprocess
import tempfile
import time

import pytest

BIN = os.environ.get("DDP_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))


def rlimits(nofile=None, nproc=None, fsize=None, address_space=None):
    """A preexec_fn that applies the given soft and hard limits in the child."""
    def apply():
        for res, v in ((resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_NPROC, nproc),
                       (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_AS, address_space)):
            if v is not None:
                resource.setrlimit(res, (v, v))
    return apply


def peak_rss_mib(pid):
    """VmHWM of a live process: its peak resident set since it started."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.fixture
def small_tmpfs():
    """A directory on a private tmpfs of the given size (MiB): a test can fill it, never the
    machine's disk. Without the rights to mount (not root, no private mount namespace), a
    plain temporary directory, and the caller must also set RLIMIT_FSIZE."""
    made = []

    def make(size_mib):
        d = tempfile.mkdtemp(prefix="ddp-hostile-")
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755", "tmpfs", d],
                           capture_output=True)
        made.append((d, r.returncode == 0))
        return d, r.returncode == 0

    yield make
    for d, mounted in made:
        if mounted:
            subprocess.run(["umount", "-l", d], capture_output=True)
        subprocess.run(["rm", "-rf", d], capture_output=True)


def wait_for(pred, timeout=10.0, step=0.01):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def raw(port):
    """A TCP connection to 127.0.0.1:port, Nagle off (attacks send small pieces)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def send_quietly(sock, data):
    """Sends what the server takes; a server that closes the connection ends it."""
    try:
        sock.sendall(data)
        return True
    except OSError:
        return False
