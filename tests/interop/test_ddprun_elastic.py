"""Elastic rendezvous (issue 4): --nnodes MIN:MAX with agents on this host as nodes over
loopback. An agent killed with SIGKILL or stopped with SIGSTOP is noticed through the store's
liveness check (its lease's will), and the survivors re-form; a late node makes the job grow;
a node beyond MAX waits as a spare; too few nodes fail after the join timeout with a message.
Membership changes never count against --max-restarts.

Workers are /bin/sh scripts that write one record per start and run until the test creates
$OUT/stop. Every wait is bounded; the fixture kills whatever a test started."""
import glob
import os
import signal
import time
import uuid

import pytest

from test_ddprun_multinode import free_port, launcher, listening, wait_for  # noqa: F401

WORKER = """
rec="$OUT/rec.$(date +%s%N).$$"
echo "rank=$RANK world=$WORLD_SIZE nodes=$GROUP_WORLD_SIZE group=$GROUP_RANK \
restarts=$TORCHELASTIC_RESTART_COUNT agent=$PPID" > "$rec.tmp" && mv "$rec.tmp" "$rec"
while [ ! -f "$OUT/stop" ]; do sleep 0.05; done
"""

# Fast liveness for tests: a lease of 0.25 s x 4 = 1 s (an ASan build on a loaded machine
# must still renew in time; a spurious re-form would only add records, which the tests allow).
FAST = "join_timeout=30,last_call_timeout=1,keep_alive_interval=0.25,keep_alive_max_attempt=4"


def records(out):
    recs = []
    for path in sorted(glob.glob(os.path.join(out, "rec.*"))):
        if path.endswith(".tmp"):
            continue
        with open(path) as f:
            recs.append(dict(kv.split("=", 1) for kv in f.read().split()))
    return recs


def with_world(out, world):
    return [r for r in records(out) if r["world"] == str(world)]


class Job:
    def __init__(self, launcher, tmp_path, nnodes, conf=FAST, nproc=1):
        self.lx = launcher
        self.out = str(tmp_path / "out")
        os.makedirs(self.out)
        self.port = free_port()
        self.args = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                     f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--rdzv-id={uuid.uuid4()}",
                     f"--rdzv-conf={conf}", "--max-restarts=0", "--no-python", "/bin/sh",
                     "-c", WORKER]

    def start(self, name):
        a = self.lx.start(*self.args, name=name, env={"OUT": self.out})
        if len(self.lx.agents) == 1:  # the first one hosts the store
            assert wait_for(lambda: listening(self.port) or a.proc.poll() is not None, 30)
        return a

    def stop_workers(self):
        open(os.path.join(self.out, "stop"), "w").close()

    def output(self):
        return "\n".join(a.output() for a in self.lx.agents) + f"\nrecords: {records(self.out)}"


def test_sigkill_of_an_agent_shrinks_the_job(launcher, tmp_path):
    job = Job(launcher, tmp_path, "2:3")
    agents = [job.start(f"node{i}") for i in range(3)]
    assert wait_for(lambda: len(with_world(job.out, 3)) >= 3, 60), job.output()
    victim = agents[2]
    victim.proc.send_signal(signal.SIGKILL)
    victim.wait(10)
    # The survivors see the will of the dead agent's lease and form a round of two.
    assert wait_for(lambda: len(with_world(job.out, 2)) >= 2, 30), job.output()
    job.stop_workers()
    for a in agents[:2]:
        assert a.wait(30) == 0, job.output()
    later = with_world(job.out, 2)
    assert {r["rank"] for r in later} == {"0", "1"}
    assert {r["agent"] for r in later} == {str(agents[0].pid), str(agents[1].pid)}
    assert {r["nodes"] for r in later} == {"2"}
    assert {r["restarts"] for r in later} == {"0"}  # membership changes are not restarts
    assert "died or stopped answering" in agents[0].stderr, job.output()


def test_sigstop_is_caught_by_the_lease_and_the_node_comes_back(launcher, tmp_path):
    job = Job(launcher, tmp_path, "2:3")
    agents = [job.start(f"node{i}") for i in range(3)]
    assert wait_for(lambda: len(with_world(job.out, 3)) >= 3, 60), job.output()
    frozen = agents[2]
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert wait_for(lambda: len(with_world(job.out, 2)) >= 2, 30), job.output()
        detected = time.monotonic() - t0  # reported, not asserted: the machine is shared
        print(f"re-formed without the stopped node after {detected:.2f} s (lease 1 s)")
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    # Thawed, it finds its round over, joins the next one and the job grows back to three.
    assert wait_for(lambda: len(with_world(job.out, 3)) >= 6, 60), job.output()
    job.stop_workers()
    for a in agents:
        assert a.wait(30) == 0, job.output()
    assert {r["restarts"] for r in records(job.out)} == {"0"}


def test_a_late_node_makes_the_job_grow(launcher, tmp_path):
    job = Job(launcher, tmp_path, "1:2", conf=FAST.replace("last_call_timeout=1",
                                                           "last_call_timeout=0.3"))
    first = job.start("first")
    assert wait_for(lambda: len(with_world(job.out, 1)) >= 1, 30), job.output()
    late = job.start("late")
    assert wait_for(lambda: len(with_world(job.out, 2)) >= 2, 30), job.output()
    job.stop_workers()
    assert first.wait(30) == 0 and late.wait(30) == 0, job.output()
    grown = with_world(job.out, 2)
    by_rank = {r["rank"]: r for r in grown}
    assert by_rank["0"]["agent"] == str(first.pid)  # the node that was there keeps rank 0
    assert by_rank["1"]["agent"] == str(late.pid)
    assert "asks to join" in first.stderr, job.output()


def test_a_node_beyond_max_waits_as_a_spare(launcher, tmp_path):
    job = Job(launcher, tmp_path, "2:2")
    a, b = job.start("a"), job.start("b")
    assert wait_for(lambda: len(with_world(job.out, 2)) >= 2, 30), job.output()
    spare = job.start("spare")
    time.sleep(1)  # give the spare time to (wrongly) disturb the job; asserted below
    job.stop_workers()
    assert a.wait(30) == 0 and b.wait(30) == 0, job.output()
    assert spare.wait(30) == 0, job.output()
    assert "spare" in spare.stderr, job.output()
    # the spare ran no worker
    assert {r["agent"] for r in records(job.out)} == {str(a.pid), str(b.pid)}


def test_too_few_nodes_fail_after_the_join_timeout(launcher, tmp_path):
    job = Job(launcher, tmp_path, "2:2", conf=FAST.replace("join_timeout=30", "join_timeout=2"))
    a, b = job.start("a"), job.start("b")
    assert wait_for(lambda: len(with_world(job.out, 2)) >= 2, 30), job.output()
    b.proc.send_signal(signal.SIGKILL)
    b.wait(10)
    assert a.wait(30) == 1, job.output()
    assert "only 1 of at least 2 nodes joined" in a.stderr, job.output()


def test_another_jobs_store_is_refused_not_joined(launcher, tmp_path):
    port = free_port()

    def args(run_id):
        return ["--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id={run_id}", "--no-python", "/bin/true"]

    first = launcher.start(*args("job-a"), name="job-a")
    assert wait_for(lambda: listening(port) or first.proc.poll() is not None, 30)
    other = launcher.start(*args("job-b"), name="job-b")
    assert other.wait(30) == 2, other.output()
    assert "store of another job (run id 'job-a'" in other.stderr, other.output()
    assert first.proc.poll() is None  # job A is left alone
