"""Helpers shared by the multi-node ddprun suites (test_ddprun_multinode.py,
test_ddprun_multinode_exits.py): ports and polling, single-node runs to completion, Agent (one
ddprun process playing one node, its output in files), and the `launcher` fixture, whose
teardown kills whatever a test started (agents, and workers whose PIDs they recorded)."""
import glob
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from conftest import BIN, popen_retry

DDPRUN = os.path.join(BIN, "ddprun")
DDPSTORE = os.path.join(BIN, "ddpstore")
PYTHON_EXEC = sys.executable
SH = ("--no-python", "/bin/sh", "-c")


# ----------------------------------------------------------------------------------- helpers

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout, interval=0.02):
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def gone(pid):
    """True once `pid` no longer runs: absent, or a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("State:"):
                    return line.split()[1] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True
    return False


def agent_env(extra=None):
    # A short grace so a worker that ignores SIGTERM can never stall a test for 30 s.
    return dict(os.environ, PYTHON_EXEC=PYTHON_EXEC, TORCH_ELASTIC_SHUTDOWN_TIMEOUT="5",
                **(extra or {}))


def ddprun(*args, env=None, timeout=120):
    """A single-node run to completion; returns the CompletedProcess."""
    p = popen_retry([DDPRUN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL, text=True, env=agent_env(env))
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"ddprun {' '.join(args)} did not finish in {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


class Agent:
    """One ddprun process (one 'node'); its stdout/stderr go to files, never a pipe that could
    fill up while the test waits on something else."""

    def __init__(self, args, workdir, name, env=None):
        self.name = name
        self.out_path = os.path.join(workdir, f"{name}.stdout")
        self.err_path = os.path.join(workdir, f"{name}.stderr")
        with open(self.out_path, "w") as out, open(self.err_path, "w") as err:
            self.proc = popen_retry([DDPRUN, *args], stdout=out, stderr=err,
                                    stdin=subprocess.DEVNULL, env=agent_env(env))
        self.pid = self.proc.pid

    @property
    def stdout(self):
        with open(self.out_path) as f:
            return f.read()

    @property
    def stderr(self):
        with open(self.err_path) as f:
            return f.read()

    def output(self):
        return f"--- {self.name} (pid {self.pid}) stdout:\n{self.stdout}\n" \
               f"--- {self.name} stderr:\n{self.stderr}"

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name} still running after {timeout} s\n{self.output()}")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


class Launcher:
    """What a test starts; teardown kills whatever is left of it."""

    def __init__(self, workdir):
        self.workdir = str(workdir)
        self.agents = []
        self.worker_pids = []  # (pid, marker): PIDs that workers of this test wrote down
        self.daemons = []

    def start(self, *args, name=None, env=None):
        a = Agent(args, self.workdir, name or f"agent{len(self.agents)}", env)
        self.agents.append(a)
        return a

    def c10d_pair(self, *args, nproc=2, run_id=None, env=None, host_first=True):
        """Two c10d agents on one endpoint. With host_first the first one is up (and so the
        host of the store) before the second starts: it is agents[0] of the pair."""
        port = free_port()
        common = ["--nnodes=2", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id or uuid.uuid4()}",
                  "--rdzv-conf=join_timeout=60"]
        a = self.start(*common, *args, name="nodeA", env=env)
        if host_first:
            assert wait_for(lambda: listening(port) or a.proc.poll() is not None, 30), \
                a.output()
            assert a.proc.poll() is None, a.output()
        b = self.start(*common, *args, name="nodeB", env=env)
        return a, b

    def cleanup(self):
        for a in self.agents:
            a.kill()
        for pid, marker in self.worker_pids:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if marker.encode() not in f.read():
                        continue  # not ours (or not any more)
                if not gone(pid):
                    os.kill(pid, signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError):
                pass
        for d in self.daemons:
            d.stop()


@pytest.fixture
def launcher(tmp_path):
    lx = Launcher(tmp_path)
    try:
        yield lx
    finally:
        lx.cleanup()


def read_records(out_dir, prefix):
    """Worker records: files <prefix>... holding 'k=v k=v ...'; returns {filename: dict}."""
    recs = {}
    for path in glob.glob(os.path.join(out_dir, prefix + "*")):
        if path.endswith(".tmp"):
            continue
        with open(path) as f:
            recs[os.path.basename(path)] = dict(kv.split("=", 1) for kv in f.read().split())
    return recs


def summary_block(stderr):
    """torchrun's failure summary: from the first '====' rule to the last."""
    start = stderr.find("=" * 60)
    assert start >= 0, "no failure summary in:\n" + stderr
    return stderr[start:]
