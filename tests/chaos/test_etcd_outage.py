"""The etcd-v3 backend on the control plane's terms (issue 32): a 3-member etcd cluster whose
members are all killed and started again, or stopped past the request timeout, while two agents
train, while a worker fails, and at the job's end. The agents ride it out as they ride out a
ddprund restart (the same reconnecting store): no restart, no re-form, each outage reported;
a cluster that stays away stops the job after --store-outage-grace, naming the members.

Every wait is bounded; the fixtures kill whatever a test started (etcd members by PID)."""
import re
import signal
import time
import uuid

from conftest import SH, read_starts, step_of, wait_for
from etcd_cluster import etcd3  # noqa: F401  (the fixture)

# A 12 s lease (1 s x 12) and 3 s requests: an outage of 6 s is past every request's timeout
# (so the agents see it) and within the lease (so nobody is declared lost).
CONF = ("--rdzv-conf=join_timeout=60,last_call_timeout=1,keep_alive_interval=1,"
        "keep_alive_max_attempt=12,read_timeout=3")
AWAY_S = 6


def etcd_pair(launcher, cluster, out, *extra, env=None):
    run = "etcd-chaos-" + uuid.uuid4().hex[:8]
    common = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=etcd-v3",
              f"--rdzv-endpoint={cluster.endpoint_list}", f"--rdzv-id={run}", "--progress=lines",
              CONF, *extra, *SH]
    env = dict({"OUT": str(out)}, **(env or {}))
    return (launcher.start(*common, name="nodeA", env=env),
            launcher.start(*common, name="nodeB", env=env))


def both_at(out, step):
    return lambda: step_of(out, 0) >= step and step_of(out, 1) >= step


def down(cluster, how):
    """Every member killed (SIGKILL) or stopped (SIGSTOP)."""
    for i in range(len(cluster.procs)):
        if how == "kill":
            cluster.kill(i)
        else:
            cluster.procs[i].send_signal(signal.SIGSTOP)


def up(cluster, how):
    for i in range(len(cluster.procs)):
        if how == "kill":
            cluster.restart(i)
        else:
            cluster.procs[i].send_signal(signal.SIGCONT)
    assert wait_for(lambda: cluster.leader() is not None, 30), cluster.logs()


def test_every_member_restarted_the_job_goes_on(launcher, tmp_path, etcd3):  # noqa: F811
    out = tmp_path / "out"
    out.mkdir()
    a, b = etcd_pair(launcher, etcd3, out, env={"STEPS": "90"})
    assert wait_for(both_at(out, 5), 60), a.output() + b.output()
    down(etcd3, "kill")
    at_kill = step_of(out, 0)
    time.sleep(AWAY_S)
    assert a.proc.poll() is None and b.proc.poll() is None, a.output() + b.output()
    assert step_of(out, 0) > at_kill, "the workers did not go on while etcd was away"
    up(etcd3, "kill")
    assert a.wait(90) == 0, a.output()
    assert b.wait(90) == 0, b.output()
    starts = read_starts(out)
    assert sorted((s["rank"], s["world"], s["restart"]) for s in starts) == \
        [("0", "2", "0"), ("1", "2", "0")], a.output() + b.output()
    assert step_of(out, 0) == 90 and step_of(out, 1) == 90
    for ag in (a, b):
        assert "lost the rendezvous store at etcd 127.0.0.1:" in ag.stderr, ag.output()
        assert "is back after" in ag.stderr, ag.output()
        assert re.search(r"store outages +\d+, ", ag.stderr), ag.output()  # the exit summary
        assert "died or stopped answering" not in ag.stderr, ag.output()


def test_a_failure_while_quorum_is_lost(launcher, tmp_path, etcd3):  # noqa: F811
    """Rank 1 fails while no member answers: its agent stops its workers, waits for etcd, then
    posts the failure; both nodes restart together, counted once."""
    out = tmp_path / "out"
    out.mkdir()
    a, b = etcd_pair(launcher, etcd3, out, "--max-restarts=1",
                     env={"STEPS": "40", "FAIL_AT": "1:15"})
    assert wait_for(both_at(out, 5), 60), a.output() + b.output()
    down(etcd3, "stop")
    try:
        assert wait_for(lambda: "rank 1 fails" in a.stdout + b.stdout, 30), \
            a.output() + b.output()
        time.sleep(AWAY_S - 2)  # past the 3 s request timeout: the failure waits for etcd
        assert a.proc.poll() is None and b.proc.poll() is None, a.output() + b.output()
    finally:
        up(etcd3, "stop")
    assert a.wait(90) == 0, a.output()
    assert b.wait(90) == 0, b.output()
    starts = read_starts(out)
    assert sorted(x["restart"] for x in starts) == ["0", "0", "1", "1"], a.output() + b.output()
    for ag in (a, b):
        assert re.search(r"restarts +1 \(failures: 1 non-zero exit\)", ag.stderr), ag.output()


def test_the_job_ends_while_etcd_is_away(launcher, tmp_path, etcd3):  # noqa: F811
    out = tmp_path / "out"
    out.mkdir()
    a, b = etcd_pair(launcher, etcd3, out, env={"STEPS": "15"})
    assert wait_for(both_at(out, 3), 60), a.output() + b.output()
    down(etcd3, "kill")
    assert wait_for(both_at(out, 15), 30)  # every worker is done; etcd is still away
    time.sleep(4)  # past the request timeout
    assert a.proc.poll() is None and b.proc.poll() is None, a.output() + b.output()
    up(etcd3, "kill")
    assert a.wait(60) == 0, a.output()
    assert b.wait(60) == 0, b.output()
    assert len(read_starts(out)) == 2, a.output() + b.output()


def test_the_agents_stop_after_the_grace(launcher, tmp_path, etcd3):  # noqa: F811
    out = tmp_path / "out"
    out.mkdir()
    a, b = etcd_pair(launcher, etcd3, out, "--store-outage-grace=3", env={"STEPS": "1000"})
    assert wait_for(both_at(out, 3), 60), a.output() + b.output()
    t0 = time.monotonic()
    down(etcd3, "kill")
    assert a.wait(60) == 1, a.output()
    assert b.wait(60) == 1, b.output()
    took = time.monotonic() - t0
    assert 3 <= took < 45, took
    for ag in (a, b):
        assert "lost the rendezvous store at etcd 127.0.0.1:" in ag.stderr, ag.output()
        assert "longer than --store-outage-grace=3.0 s" in ag.stderr, ag.output()
