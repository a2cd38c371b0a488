"""Fixtures shared by the interop tests: a ddprund process on 127.0.0.1:0 (read back from its
--port-file), torch's own TCPStore server for side-by-side checks, and helpers to run a piece
of Python in a second process (torch's client calls can hold the GIL, so concurrency between
clients is always between processes)."""
import errno
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

BIN = os.environ.get("DDP_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))


def popen_retry(argv, **kw):
    """subprocess.Popen, retrying 'text file busy' or a missing file for up to 2 minutes: the
    binaries may be relinked while a suite runs."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return subprocess.Popen(argv, **kw)
        except OSError as e:
            if e.errno not in (errno.ETXTBSY, errno.ENOENT) or time.monotonic() > deadline:
                raise
            time.sleep(5)


def ddprund_path():
    path = os.path.join(BIN, "ddprund")
    if not os.path.exists(path):
        pytest.fail(f"ddprund not found at {path}: build first or set DDP_BIN_DIR")
    return path


class Daemon:
    """ddprund started with --port 0; stop() sends SIGTERM and returns the exit code."""

    def __init__(self, *args):
        self.dir = tempfile.mkdtemp(prefix="ddprund-test-")
        port_file = os.path.join(self.dir, "port")
        self.log = open(os.path.join(self.dir, "log"), "w+")
        self.proc = subprocess.Popen(
            [ddprund_path(), "--port", "0", "--port-file", port_file, *args],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                pytest.fail("ddprund did not start: " + self.log.read())
            time.sleep(0.01)
        self.port = int(open(port_file).read())

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


@pytest.fixture
def daemon():
    d = Daemon()
    yield d
    rc = d.stop()
    assert rc == 0, "ddprund did not exit cleanly on SIGTERM:\n" + d.output()
    assert "closing connection" not in d.output(), d.output()


def run_py(code, timeout=60, env=None):
    """Runs `code` in a fresh interpreter (the same python as the tests); returns stdout."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=timeout, env=env)
    assert p.returncode == 0, f"child failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p.stdout


def start_py(code, env=None):
    return subprocess.Popen([sys.executable, "-u", "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def run_ranks_py(code, port, n=2, timeout=120):
    """Runs `code` as n processes (argv: port, rank) of the test's python; returns their
    stdouts, asserting each exited 0."""
    kids = [subprocess.Popen([sys.executable, "-c", code, str(port), str(r)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for r in range(n)]
    outs = []
    for k in kids:
        out, err = k.communicate(timeout=timeout)
        assert k.returncode == 0, err
        outs.append(out)
    return outs
