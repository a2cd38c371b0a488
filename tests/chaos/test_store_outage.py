"""The control plane never stops training (issue 32): two c10d agents rendezvous through a
ddprund that is restarted (SIGTERM, SIGKILL; with and without --data-dir), stopped (SIGSTOP,
longer than the lease ttl) or gone for good, at the points that matter: mid-training, while a
worker fails, at the job's end. A job that rides an outage out starts each worker once (no
restart), reaches its last step, and says so; one whose store stays away stops after
--store-outage-grace, naming the store and how long it was gone."""
import json
import os
import re
import signal
import time
import uuid

import pytest

from conftest import SH, read_starts, step_of, wait_for
from ddp_train_helpers import TRAIN, needs_ddp_train, needs_fmnist

def pair(launcher, store, out, *extra, env=None, argv=SH):
    run = "chaos-" + uuid.uuid4().hex[:8]
    common = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint={store.endpoint}", f"--rdzv-id={run}", "--progress=lines",
              "--rdzv-conf=join_timeout=60", *extra]
    env = dict({"OUT": str(out)}, **(env or {}))
    return (launcher.start(*common, *argv, name="nodeA", env=env),
            launcher.start(*common, *argv, name="nodeB", env=env))


def both_at(out, step):
    return lambda: step_of(out, 0) >= step and step_of(out, 1) >= step


def assert_went_on(agents, out, steps):
    """Each worker started once, with the round's ranks, and reached its last step."""
    starts = read_starts(out)
    assert sorted((s["rank"], s["world"], s["restart"]) for s in starts) == \
        [("0", "2", "0"), ("1", "2", "0")], "\n".join(a.output() for a in agents)
    assert step_of(out, 0) == steps and step_of(out, 1) == steps
    for a in agents:
        assert "lost the rendezvous store at" in a.stderr, a.output()
        assert "the workers go on while it reconnects" in a.stderr, a.output()
        assert "is back after" in a.stderr, a.output()
        assert re.search(r"store outages +1, ", a.stderr), a.output()  # the exit summary


@pytest.mark.parametrize("how", ["sigterm", "sigkill", "sigkill-data-dir"])
def test_a_restarted_store_does_not_stop_the_job(launcher, store, tmp_path, how):
    out = tmp_path / "out"
    out.mkdir()
    args = ("--data-dir", str(tmp_path / "data")) if how.endswith("data-dir") else ()
    s = store(*args)
    a, b = pair(launcher, s, out, env={"STEPS": "100"})
    assert wait_for(both_at(out, 5), 60), a.output() + b.output()
    s.stop(signal.SIGKILL if how.startswith("sigkill") else signal.SIGTERM)
    at_kill = step_of(out, 0)
    time.sleep(2)
    assert a.proc.poll() is None and b.proc.poll() is None, a.output() + b.output()
    assert step_of(out, 0) > at_kill, "the workers did not go on while the store was away"
    s.start()
    # Each agent says the store is back within the backoff's window, while the job still runs
    # (not only when the round's event or its end next answers).
    assert wait_for(lambda: "is back after" in a.stderr and "is back after" in b.stderr, 15), \
        a.output() + b.output()
    assert step_of(out, 0) < 100, "the store's return was said only at the job's end"
    assert a.wait(90) == 0, a.output()
    assert b.wait(90) == 0, b.output()
    assert_went_on((a, b), out, 100)
    if args:
        # The journal kept both agents' leases (with their wills) and the round's keys.
        assert "and 2 leases from" in s.output(), s.output()


def test_a_stopped_store_longer_than_the_lease_ttl(launcher, store, tmp_path):
    """SIGSTOP for 5 s with a 2 s lease ttl: the store gives its leases the time it did not
    run, so no agent is declared lost, and the job goes on."""
    out = tmp_path / "out"
    out.mkdir()
    s = store()
    a, b = pair(launcher, s, out, "--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=2",
                env={"STEPS": "50"})
    assert wait_for(both_at(out, 5), 60), a.output() + b.output()
    s.send(signal.SIGSTOP)
    time.sleep(5)
    s.send(signal.SIGCONT)
    assert a.wait(90) == 0, a.output()
    assert b.wait(90) == 0, b.output()
    starts = read_starts(out)
    assert [s_["restart"] for s_ in starts] == ["0", "0"], a.output() + b.output()
    assert "did not run for" in s.output(), s.output()
    assert "died or stopped answering" not in a.stderr + b.stderr


def test_the_agents_stop_after_the_grace(launcher, store, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    s = store()
    a, b = pair(launcher, s, out, "--store-outage-grace=3", env={"STEPS": "1000"})
    assert wait_for(both_at(out, 3), 60), a.output() + b.output()
    t0 = time.monotonic()
    s.stop(signal.SIGKILL)
    assert a.wait(30) == 1, a.output()
    assert b.wait(30) == 1, b.output()
    took = time.monotonic() - t0
    assert 3 <= took < 25, took
    for ag in (a, b):
        assert f"lost the rendezvous store at {s.endpoint} (unreachable for" in ag.stderr, \
            ag.output()
        assert "longer than --store-outage-grace=3.0 s" in ag.stderr, ag.output()
    pids = [int(x["pid"]) for x in read_starts(out)]
    assert wait_for(lambda: all(not os.path.exists(f"/proc/{p}/cmdline") or
                                open(f"/proc/{p}/cmdline", "rb").read() == b"" for p in pids), 10)


def test_a_failure_while_the_store_is_away(launcher, store, tmp_path):
    """Rank 1 fails while the store is down: its agent stops its workers, waits for the store,
    then posts the failure; both nodes restart together, counted once."""
    out = tmp_path / "out"
    out.mkdir()
    s = store()
    a, b = pair(launcher, s, out, "--max-restarts=1", env={"STEPS": "25", "FAIL_AT": "1:12"})
    assert wait_for(both_at(out, 3), 60), a.output() + b.output()
    s.stop(signal.SIGTERM)
    assert wait_for(lambda: "rank 1 fails" in a.stdout + b.stdout, 30), a.output() + b.output()
    time.sleep(1)
    s.start()  # came back empty: the failed node posts its failure to it
    assert a.wait(90) == 0, a.output()
    assert b.wait(90) == 0, b.output()
    starts = read_starts(out)
    assert sorted(x["restart"] for x in starts) == ["0", "0", "1", "1"], a.output() + b.output()
    for ag in (a, b):
        assert re.search(r"restarts +1 \(failures: 1 non-zero exit\)", ag.stderr), ag.output()


def test_the_job_ends_while_the_store_is_away(launcher, store, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    s = store()
    a, b = pair(launcher, s, out, env={"STEPS": "12"})
    assert wait_for(both_at(out, 3), 60), a.output() + b.output()
    s.stop(signal.SIGTERM)
    assert wait_for(both_at(out, 12), 30)  # every worker is done; the store is still away
    time.sleep(1)
    assert a.proc.poll() is None and b.proc.poll() is None, a.output() + b.output()
    s.start()
    assert a.wait(60) == 0, a.output()
    assert b.wait(60) == 0, b.output()
    assert_went_on((a, b), out, 12)


def train_argv(metrics):
    return ("--no-python", TRAIN, "--model", "mlp", "--train-subset", "20000", "--batch-size",
            "32", "--threads", "1", "--snapshot", "", "--no-eval", "--log-every", "100",
            "--metrics-json", str(metrics), "6", "0")


@needs_ddp_train
@needs_fmnist
def test_ddp_train_loses_no_step_to_a_store_restart(launcher, store, tmp_path):
    """The issue's case: ddprund restarted mid-training. The job ends with the parameters of
    an undisturbed run of the same job, bit for bit: no step lost, none repeated."""
    results = {}
    for run in ("undisturbed", "restarted"):
        out = tmp_path / run
        out.mkdir()
        s = store()
        metrics = out / "metrics.json"
        a, b = pair(launcher, s, out, env={"OMP_NUM_THREADS": "1"}, argv=train_argv(metrics))
        if run == "restarted":
            assert wait_for(lambda: "step 200/" in a.stdout, 120), a.output()
            s.stop(signal.SIGTERM)
            time.sleep(2)
            s.start()
        assert a.wait(300) == 0, a.output()
        assert b.wait(300) == 0, b.output()
        results[run] = json.loads(metrics.read_text())
        s.stop()
    assert "is back after" in a.stderr, a.output()
    assert results["restarted"]["steps"] == results["undisturbed"]["steps"]
    assert results["restarted"]["param_checksum"] == results["undisturbed"]["param_checksum"]


def test_a_node_that_dies_during_the_outage_is_seen_when_the_store_returns(launcher, store,
                                                                          tmp_path):
    """nodeB is killed (SIGKILL, its workers with it) while ddprund is down; ddprund comes back
    from its journal, B's restored lease waits one ttl for B's keepalive, expires, and its will
    tells A, which re-forms alone (elastic 1:2) and finishes; membership changes are not
    restarts (as torchrun's), so nothing is counted against --max-restarts."""
    out = tmp_path / "out"
    out.mkdir()
    s = store("--data-dir", str(tmp_path / "data"))
    run = "dies-" + uuid.uuid4().hex[:8]
    common = ["--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint={s.endpoint}", f"--rdzv-id={run}", "--progress=lines",
              "--max-restarts=1", "--rdzv-conf=join_timeout=60,last_call_timeout=1,"
              "keep_alive_interval=1,keep_alive_max_attempt=3", *SH]
    env = {"OUT": str(out), "STEPS": "100"}
    a = launcher.start(*common, name="nodeA", env=env)
    assert wait_for(lambda: len(read_starts(out)) >= 1 or a.proc.poll() is not None, 30)
    b = launcher.start(*common, name="nodeB", env=env)
    assert wait_for(lambda: [x["world"] for x in read_starts(out)][-2:] == ["2", "2"] and
                    both_at(out, 3)(), 60), a.output() + b.output()
    s.stop(signal.SIGKILL)
    b.kill()
    time.sleep(2)
    s.start()
    # Seen within the restored lease's ttl (3 s) and the re-form, with room for a slow machine.
    assert wait_for(lambda: read_starts(out)[-1]["world"] == "1", 30), a.output() + b.output()
    assert a.wait(90) == 0, a.output()
    starts = read_starts(out)
    # A alone, A and B, A alone again after B's death was seen
    assert [x["world"] for x in starts] == ["1", "2", "2", "1"], a.output()
    assert starts[-1]["rank"] == "0" and step_of(out, 0) == 100
    assert "died or stopped answering the store" in a.stderr, a.output()
    assert re.search(r"restarts +0 \(failures: 1 node joined, 1 node lost\)", a.stderr), \
        a.output()
