"""The chaos suite's parts (issue 32): a ddprund that can be stopped, killed and started again
on the same port, c10d agents with their output in files, and a worker that writes down every
start (rank, world size, restart count) and every step, so a test can tell a job that went on
from one that restarted. Bounds: scripts/test.sh runs the suite under a file-size limit
(prlimit --fsize), every wait has a timeout, and the launcher fixture's teardown kills
whatever a test started."""
import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "interop"))
_spec = importlib.util.spec_from_file_location(
    "interop_conftest", os.path.join(HERE, "..", "interop", "conftest.py"))
_interop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_interop)
BIN, popen_retry = _interop.BIN, _interop.popen_retry  # for ddprun_multinode_helpers

from ddprun_multinode_helpers import launcher, wait_for  # noqa: E402,F401  (the fixture)

DDPRUND = os.path.join(BIN, "ddprund")

# A worker: appends "start rank=R world=W restart=N pid=P" to $OUT/starts, then counts STEPS
# steps of STEP_S seconds, the last one reached in $OUT/step_<rank> (renamed into place: a
# reader never sees the file empty, as `echo > file` would show it); FAIL_AT=R:S makes rank R
# exit 3 at step S of its first attempt.
WORKER = r'''
echo "start rank=$RANK world=$WORLD_SIZE restart=$TORCHELASTIC_RESTART_COUNT pid=$$" >> "$OUT/starts"
i=0
while [ $i -lt "${STEPS:-30}" ]; do
  if [ "${FAIL_AT:-}" = "$RANK:$i" ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
    echo "rank $RANK fails at step $i"; exit 3
  fi
  i=$((i+1)); echo $i > "$OUT/.step_$RANK"; mv -f "$OUT/.step_$RANK" "$OUT/step_$RANK"
  sleep "${STEP_S:-0.2}"
done
'''
SH = ("--no-python", "/bin/sh", "-c", WORKER)


def restartable_port():
    """A free port below the kernel's ephemeral range. A store restarted on a port of that
    range can find it taken meanwhile as some connection's source port (and a client may
    connect to itself there); real stores use such ports too (29400)."""
    import random
    import socket
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for _ in range(200):
        port = random.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    pytest.fail("no free port below the ephemeral range")


class Store:
    """ddprund on a port chosen once: stopped, killed or paused with send(), and start()ed
    again on the same port (with the same --data-dir, when given)."""

    def __init__(self, workdir, *args):
        self.workdir, self.args, self.proc, self.runs = workdir, args, None, 0
        self.port = restartable_port()
        self.start()

    def start(self):
        self.runs += 1
        port_file = os.path.join(self.workdir, f"store.{self.port}.{self.runs}.port")
        self.log_path = os.path.join(self.workdir, f"store.{self.port}.{self.runs}.log")
        with open(self.log_path, "w") as log:
            self.proc = popen_retry([DDPRUND, "--port", str(self.port), "--port-file", port_file,
                                     "--http-port", "-1", *self.args],
                                    stdout=log, stderr=subprocess.STDOUT)
        assert wait_for(lambda: os.path.exists(port_file) or self.proc.poll() is not None, 15)
        assert self.proc.poll() is None, self.output()
        assert int(open(port_file).read()) == self.port
        return self

    def output(self):
        with open(self.log_path) as f:
            return f.read()

    def send(self, sig):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM):
        self.send(sig)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @property
    def endpoint(self):
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def store(tmp_path):
    made = []

    def make(*args):
        s = Store(str(tmp_path), *args)
        made.append(s)
        return s

    yield make
    for s in made:
        s.send(signal.SIGCONT)
        s.stop(signal.SIGKILL)


def read_starts(out):
    """The workers' starts, in order: [{'rank': .., 'world': .., 'restart': .., 'pid': ..}]."""
    path = os.path.join(out, "starts")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [dict(kv.split("=", 1) for kv in line.split()[1:]) for line in f if line.strip()]


def step_of(out, rank):
    try:
        with open(os.path.join(out, f"step_{rank}")) as f:
            return int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        return 0
