"""ddp-train's native progress (DDPRUN_PROGRESS_FD) and the faults the hang tests inject
(DDP_TRAIN_FAULT=RANK:STEP:hang and RANK:STEP:slow=F), seen from outside the trainer.

The test plays the agent: it makes one non-blocking pipe per local rank, hands the write ends
to `ddprun --standalone` (ddprun keeps the descriptors it inherited open in its workers), and a
one-line shell wrapper gives each worker its own pipe as DDPRUN_PROGRESS_FD, picked by
LOCAL_RANK. The wrapper's value wins over any ddprun may set itself, so these tests read
exactly what ddp-train writes, whatever the agent does with its own pipes (the agent's side is
tested in test_hangs.py). Lines are "step=<n> phase=<word> t=<unix seconds>"; n counts global
steps from 0, as DDP_TRAIN_FAULT does.

Every run is small (the synthetic dataset, or a 2048-sample subset of Fashion-MNIST, a few
steps), bounded by timeouts, and ends every process it started.
"""
import collections
import fcntl
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import time

import pytest

from support.pytest_tools import missing_tool

from conftest import popen_retry
from ddp_train_helpers import (DDPRUN, FMNIST, TRAIN, clean_env, needs_ddp_train, needs_fmnist,
                               output, train)

pytestmark = needs_ddp_train

LINE = re.compile(r"step=(\d+) phase=([a-z]+) t=(\d+\.\d{6})(?: samples=\d+)?(?: total=\d+)?"
                  r"(?: (?:loss|lr|val_loss|tokens_per_s)=-?[0-9.e+-]+)*")
# Each worker takes the pipe named PROGRESS_FD_<its LOCAL_RANK>.
WRAPPER = 'eval "export DDPRUN_PROGRESS_FD=\\$PROGRESS_FD_$LOCAL_RANK"; exec "$0" "$@"'
SYNTHETIC = ["--dataset", "synthetic", "--threads", "1", "--no-eval"]


class ProgressJob:
    """ddp-train under ddprun with a progress pipe per local rank read here. lines[r] holds
    (step, phase, worker's t, arrival time) per line of local rank r."""

    def __init__(self, tmp_path, nproc, args, env=None, launcher_args=()):
        self.nproc = nproc
        self.reads = {}  # read fd -> local rank
        self.pending = {}
        self.lines = {r: [] for r in range(nproc)}
        self.bad = []
        self.declared = collections.Counter()  # local rank -> "recover=..." declarations
        extra = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "3", **(env or {})}
        writes = []
        for r in range(nproc):
            rd, wr = os.pipe()
            fcntl.fcntl(wr, fcntl.F_SETFL, fcntl.fcntl(wr, fcntl.F_GETFL) | os.O_NONBLOCK)
            os.set_blocking(rd, False)
            self.reads[rd] = r
            self.pending[rd] = b""
            writes.append(wr)
            extra[f"PROGRESS_FD_{r}"] = str(wr)
        argv = [DDPRUN, "--standalone", f"--nproc-per-node={nproc}", *launcher_args,
                "--no-python", "/bin/sh", "-c", WRAPPER, TRAIN, *args]
        self.out = open(tmp_path / "stdout", "w+")
        self.err = open(tmp_path / "stderr", "w+")
        try:
            self.proc = popen_retry(argv, stdout=self.out, stderr=self.err,
                                    stdin=subprocess.DEVNULL, cwd=str(tmp_path),
                                    env=clean_env(extra), pass_fds=writes)
        finally:
            for wr in writes:
                os.close(wr)  # the workers hold them now; EOF once every worker is gone

    def pump(self, timeout):
        """Reads what arrives within `timeout` s; returns whether any line came."""
        got = False
        if not self.reads:
            time.sleep(timeout)
            return False
        ready, _, _ = select.select(list(self.reads), [], [], timeout)
        now = time.monotonic()
        for fd in ready:
            data = os.read(fd, 65536)
            if not data:  # every writer gone
                os.close(fd)
                del self.reads[fd]
                continue
            buf = self.pending[fd] + data
            *whole, self.pending[fd] = buf.split(b"\n")
            for raw in whole:
                # The in-place recovery handshake, once: "elastic" where ddprun's control pipe
                # is there to regroup on (docs/worker_runtime.md).
                if raw in (b"recover=in_place", b"recover=elastic"):
                    self.declared[self.reads[fd]] += 1
                    continue
                m = LINE.fullmatch(raw.decode())
                if m is None:
                    self.bad.append(raw)
                    continue
                self.lines[self.reads[fd]].append(
                    (int(m.group(1)), m.group(2), float(m.group(3)), now))
                got = True
        return got

    def pump_until_quiet(self, quiet_s, limit_s):
        """Reads until no line came for `quiet_s` (True) or `limit_s` passed (False)."""
        deadline = time.monotonic() + limit_s
        last = time.monotonic()
        while time.monotonic() < deadline:
            if self.pump(0.1):
                last = time.monotonic()
            elif time.monotonic() - last >= quiet_s and any(self.lines.values()):
                return True
        return False

    def wait(self, timeout):
        """Reads until ddprun exits (bounded); returns its exit code."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"ddprun did not finish in {timeout} s\n{self.output()}")
            self.pump(0.1)
        while self.reads and self.pump(0.2):
            pass
        return self.proc.returncode

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # ddprun stops its workers
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for fd in list(self.reads):
            os.close(fd)
        self.reads.clear()

    def output(self):
        self.out.flush()
        self.err.flush()
        return (f"--- exit {self.proc.poll()}\n--- stdout:\n{open(self.out.name).read()}\n"
                f"--- stderr:\n{open(self.err.name).read()}\n--- progress:\n{self.lines}")

    def worker_pid(self, rank):
        """The pid of the ddp-train worker with RANK=rank among ddprun's descendants."""
        children = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(d))
        todo, found = [self.proc.pid], []
        while todo:
            pid = todo.pop()
            for c in children.get(pid, []):
                todo.append(c)
                try:
                    with open(f"/proc/{c}/environ", "rb") as f:
                        env = f.read().split(b"\0")
                    with open(f"/proc/{c}/comm") as f:
                        comm = f.read().strip()
                except OSError:
                    continue
                if comm == "ddp-train" and f"RANK={rank}".encode() in env:
                    found.append(c)
        assert len(found) == 1, f"rank {rank}: ddp-train workers {found}\n{self.output()}"
        return found[0]


@pytest.fixture
def jobs():
    started = []
    yield lambda *a, **kw: started.append(ProgressJob(*a, **kw)) or started[-1]
    for j in started:
        j.stop()
        j.out.close()
        j.err.close()


def steps_and_phases(lines):
    return [(s, p) for s, p, _, _ in lines]


# ------------------------------------------------------------------ 1. one line per phase

def test_each_step_reports_compute_then_allreduce(tmp_path, jobs):
    job = jobs(tmp_path, 2, [*SYNTHETIC, "--max-steps", "6", "--snapshot",
                             str(tmp_path / "s.ddp"), "1", "0"])
    assert job.wait(60) == 0, job.output()
    assert not job.bad, f"lines that are not progress: {job.bad}"
    # ddp-train under ddprun declares in-place recovery once per rank, when training starts.
    assert job.declared == {0: 1, 1: 1}, job.declared
    every_step = [(n, p) for n in range(6) for p in ("compute", "allreduce")]
    # Rank 0 writes the end-of-run snapshot at global step 6 (the next step to take).
    assert steps_and_phases(job.lines[0]) == every_step + [(6, "checkpoint")], job.output()
    assert steps_and_phases(job.lines[1]) == every_step, job.output()
    for r in (0, 1):
        ts = [t for _, _, t, _ in job.lines[r]]
        assert ts == sorted(ts), f"rank {r}: the worker's clock went backwards: {ts}"
        # t is the worker's wall clock, in unix seconds with microseconds.
        assert abs(ts[-1] - time.time()) < 300, (ts[-1], time.time())


def test_bad_progress_fd_is_told_once_and_training_goes_on(tmp_path):
    for value, reason in (("abc", "DDPRUN_PROGRESS_FD 'abc' is not an integer"),
                          ("2", "DDPRUN_PROGRESS_FD=2 is a standard stream"),
                          ("999", "DDPRUN_PROGRESS_FD=999 is not an open descriptor")):
        p = train([*SYNTHETIC, "--max-steps", "3", "--snapshot", "", "1", "0"], tmp_path,
                  env={"DDPRUN_PROGRESS_FD": value}, timeout=30)
        assert p.returncode == 0, output(p)
        warnings = [ln for ln in p.stderr.splitlines() if "DDPRUN_PROGRESS_FD" in ln]
        assert len(warnings) == 1 and reason in warnings[0], output(p)
        assert warnings[0].startswith("ddp-train: warning: "), output(p)


# ---------------------------------------------------------------------------- 2. the hang

def test_hang_blocks_before_allreduce_and_a_restart_recovers(tmp_path, jobs):
    # Rank 1 hangs before the all-reduce of step 3 on the first attempt; rank 0 waits inside it.
    job = jobs(tmp_path, 2, [*SYNTHETIC, "--max-steps", "8", "--snapshot",
                             str(tmp_path / "s.ddp"), "1", "0"],
               env={"DDP_TRAIN_FAULT": "1:3:hang"}, launcher_args=["--max-restarts=1"])
    assert job.pump_until_quiet(2.0, 15), f"progress never stopped\n{job.output()}"
    assert job.proc.poll() is None, job.output()
    # Where each rank stopped names the culprit: rank 1 never left step 3's compute phase.
    assert steps_and_phases(job.lines[1])[-1] == (3, "compute"), job.output()
    assert steps_and_phases(job.lines[0])[-1] == (3, "allreduce"), job.output()
    hung = job.worker_pid(1)
    stack = None
    if shutil.which("eu-stack"):
        p = subprocess.run(["eu-stack", "-p", str(hung)], capture_output=True, text=True,
                           timeout=30)
        stack = p.stdout + p.stderr
    # A restart recovers: the fault is for the first attempt only. Killing the hung rank is a
    # failure; ddprun restarts both ranks, which resume from rank 0's snapshot at step 3.
    os.kill(hung, signal.SIGKILL)
    assert job.wait(60) == 0, job.output()
    out = open(job.out.name).read()
    assert "rank 1 hangs before the gradient all-reduce of step 3" in out, job.output()
    assert "resuming from snapshot" in out, job.output()
    after = steps_and_phases(job.lines[1])
    cut = after.index((3, "compute")) + 1
    assert (3, "allreduce") in after[cut:] and (4, "compute") in after[cut:], job.output()
    if stack is None:
        missing_tool("eu-stack (Debian's elfutils): the hung rank's stack was not checked")
    assert "injected_hang_before_allreduce" in stack, stack


def test_hang_ends_on_sigterm_with_the_signal_code(tmp_path):
    # One process (no RANK): it hangs at step 2 and SIGTERM ends it at once with 128 + 15.
    p = popen_retry([TRAIN, *SYNTHETIC, "--max-steps", "5", "--snapshot", "", "1", "0"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                    text=True, cwd=str(tmp_path), env=clean_env({"DDP_TRAIN_FAULT": "0:2:hang"}))
    try:
        deadline = time.monotonic() + 20
        line = p.stdout.readline()
        while "hangs before" not in line and line and time.monotonic() < deadline:
            line = p.stdout.readline()
        assert "rank 0 hangs before the gradient all-reduce of step 2" in line, line
        time.sleep(0.3)
        assert p.poll() is None, "the hang ended by itself"
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        if p.poll() is None:
            p.kill()
        p.communicate()


# --------------------------------------------------------------------------- 3. slowness

@needs_fmnist
def test_a_rank_slowed_thirtyfold_computes_over_three_times_longer(tmp_path, jobs):
    # Under a synchronous all-reduce every rank's wall time per step is the slowest rank's; the
    # straggler shows in the compute phase (compute -> allreduce), which the others spend waiting
    # in the all-reduce instead. slow=30 from step 20 sleeps 29x the rank's own compute after it.
    # Rank 1 is compared with itself before step 20, under the same load (2 cores, two ranks, a
    # second test, a sanitizer build), which another rank's compute is not: about 30 on an idle
    # machine. Before step 20 rank 1's compute phase also holds its waits for rank 0's gradient
    # buckets (the all-reduce overlaps the backward); once it is the straggler it waits for no
    # one, so the ratio falls under load: with slow=10 a loaded CI run saw 2.7 (0.013 s against
    # 0.005 s). 30 leaves room for waits up to 10x the compute itself.
    args = ["--data", FMNIST, "--train-subset", "4096", "--threads", "1", "--no-eval",
            "--batch-size", "32", "--max-steps", "40", "--snapshot", "", "1", "0"]
    job = jobs(tmp_path, 2, args, env={"DDP_TRAIN_FAULT": "1:20:slow=30"})
    assert job.wait(90) == 0, job.output()
    assert "slow from step 20" in open(job.out.name).read(), job.output()

    def compute_s(rank, first, last):
        starts = {s: t for s, p, t, _ in job.lines[rank] if p == "compute"}
        ends = {s: t for s, p, t, _ in job.lines[rank] if p == "allreduce"}
        steps = [s for s in ends if first <= s <= last and s in starts]
        assert len(steps) == last - first + 1, job.output()
        return statistics.median(ends[s] - starts[s] for s in steps)

    before, after = compute_s(1, 4, 19), compute_s(1, 20, 39)  # past the first steps' warm-up
    assert before > 0, job.output()
    print(f"rank 1's median compute phase: {before:.6f} s before step 20, {after:.6f} s from it "
          f"(rank 0 from it: {compute_s(0, 20, 39):.6f} s)")
    assert after / before > 3, f"rank 1 computes {after:.6f} s per step slowed, {before:.6f} s before"
