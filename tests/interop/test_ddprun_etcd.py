"""The etcd-v3 rendezvous backend (issue 21) with real ddprun agents (processes on this host as
nodes) and a real etcd cluster (etcd_cluster.py: Debian's etcd 3.4, 1 or 3 members on loopback):
rounds through 1- and 3-member clusters, a worker failure restarting every node, the etcd leader
killed mid-round and mid-training (no restart counted), the worker store's host killed (the
survivors re-form and resume ddp-train from its snapshot), an agent stopped with SIGSTOP (its
lease expires and the others re-form), and a cluster that does not answer at start.

Workers are /bin/sh scripts writing one record per start, running until $OUT/stop exists, or
ddp-train. Every wait is bounded; the fixtures kill whatever a test started, by PID."""
import os
import re
import signal
import time
import uuid

import pytest

from ddprun_multinode_helpers import BIN, launcher, wait_for  # noqa: F401
from etcd_cluster import EtcdCluster, etcd1, etcd3  # noqa: F401
from test_ddprun_elastic import records  # the same worker records

WORKER = """
rec="$OUT/rec.$(date +%s%N).$$"
echo "rank=$RANK world=$WORLD_SIZE group=$GROUP_RANK restarts=$TORCHELASTIC_RESTART_COUNT \
agent=$PPID master=$MASTER_ADDR:$MASTER_PORT" > "$rec.tmp" && mv "$rec.tmp" "$rec"
if [ -n "$FAIL_RANK" ] && [ "$RANK" = "$FAIL_RANK" ] && [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  # Fail only once every rank of this attempt has written its record (at most 20 s): a failure
  # at once may stop the other nodes' workers before they write, which the test would misread.
  i=0
  while [ "$(cat "$OUT"/rec.* 2>/dev/null | grep -c "restarts=0 ")" -lt "$WORLD_SIZE" ] && \
        [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
  exit 3
fi
while [ ! -f "$OUT/stop" ]; do sleep 0.05; done
"""

# A lease of 0.5 s x 4 = 2 s: short for the tests, long enough for an etcd election (500 ms).
FAST = "join_timeout=40,last_call_timeout=1,keep_alive_interval=0.5,keep_alive_max_attempt=4"
LEASE_S = 2.0
MARGIN_S = 10.0  # docs/rendezvous.md: a lost agent is noticed within its lease plus this


class Job:
    def __init__(self, launcher, tmp_path, cluster, nnodes, conf=FAST, backend="etcd-v3",  # noqa: F811
                 max_restarts=0, env=None, command=None):
        self.lx = launcher
        self.out = str(tmp_path / "out")
        os.makedirs(self.out, exist_ok=True)
        self.env = dict(env or {}, OUT=self.out)
        self.run_id = str(uuid.uuid4())
        self.args = [f"--nnodes={nnodes}", "--nproc-per-node=1", f"--rdzv-backend={backend}",
                     f"--rdzv-endpoint={cluster.endpoint_list}", f"--rdzv-id={self.run_id}",
                     f"--rdzv-conf={conf}", f"--max-restarts={max_restarts}",
                     "--log-line-prefix-template=[g${group_rank} r${rank}]: ",
                     *(command or ["--no-python", "/bin/sh", "-c", WORKER])]

    def start(self, name):
        return self.lx.start(*self.args, name=name, env=self.env)

    def stop_workers(self):
        open(os.path.join(self.out, "stop"), "w").close()

    def output(self):
        return "\n".join(a.output() for a in self.lx.agents) + f"\nrecords: {records(self.out)}"

    def joined(self, cluster):
        """The node records of this run's rounds in etcd (P/r<n>/node/<k>, rendezvous.cpp:
        written by an agent once it has joined a round, before it waits for the seal)."""
        node = re.compile(rf"/ddprun/{re.escape(self.run_id)}/r\d+/node/\d+$")
        return [k for k in cluster.keys() or [] if node.search(k)]


@pytest.mark.parametrize("members,nodes", [(1, 2), (3, 4)])
def test_agents_rendezvous_and_a_failure_restarts_every_node(launcher, tmp_path, members,  # noqa: F811
                                                              nodes):
    cluster = EtcdCluster(members)
    try:
        # torchrun's spelling on the 3-member run: it runs as etcd-v3, with a note.
        backend = "etcd" if members == 3 else "etcd-v3"
        job = Job(launcher, tmp_path, cluster, nodes, backend=backend, max_restarts=1,
                  env={"FAIL_RANK": "1"})
        agents = [job.start(f"node{i}") for i in range(nodes)]
        done = lambda: len([r for r in records(job.out) if r["restarts"] == "1"]) >= nodes
        assert wait_for(done, 90), job.output()
        job.stop_workers()
        for a in agents:
            assert a.wait(30) == 0, job.output()
        for attempt in ("0", "1"):
            recs = [r for r in records(job.out) if r["restarts"] == attempt]
            assert sorted(int(r["rank"]) for r in recs) == list(range(nodes)), job.output()
            assert {r["world"] for r in recs} == {str(nodes)}
            assert len({r["master"] for r in recs}) == 1  # one worker store per round
        assert len({r["agent"] for r in records(job.out)}) == nodes
        if backend == "etcd":
            assert "--rdzv-backend=etcd runs as etcd-v3" in agents[0].stderr
    finally:
        cluster.stop()


@pytest.mark.parametrize("when", ["round", "training"])
def test_the_etcd_leader_killed_costs_no_restart(launcher, tmp_path, etcd3, when):  # noqa: F811
    job = Job(launcher, tmp_path, etcd3, 2)
    a = job.start("nodeA")
    if when == "round":
        # A has joined (its node record is in etcd) and waits for B: the kill lands mid-round.
        assert wait_for(lambda: len(job.joined(etcd3)) == 1, 30), job.output()
        leader = etcd3.leader()
        etcd3.kill(leader)
        b = job.start("nodeB")
        assert wait_for(lambda: len(records(job.out)) >= 2, 60), job.output()
    else:
        b = job.start("nodeB")
        assert wait_for(lambda: len(records(job.out)) >= 2, 60), job.output()
        leader = etcd3.leader()
        etcd3.kill(leader)
    assert wait_for(lambda: etcd3.leader() not in (None, leader), 30), etcd3.logs()
    time.sleep(2 * LEASE_S)  # keepalives and watches through the election and after it
    job.stop_workers()
    for x in (a, b):
        assert x.wait(30) == 0, job.output()
    recs = records(job.out)
    assert len(recs) == 2, job.output()  # one round: nobody restarted or re-formed
    assert {r["restarts"] for r in recs} == {"0"}
    assert "died or stopped answering" not in a.stderr + b.stderr, job.output()


def test_the_worker_store_host_killed_the_survivors_regroup(launcher, tmp_path, etcd1):  # noqa: F811
    snap = str(tmp_path / "run.ddp")
    train = [os.path.join(BIN, "ddp-train"), "--batch-size", "32", "--train-subset", "30000",
             "--log-every", "200", "--snapshot", snap, "3", "1"]
    job = Job(launcher, tmp_path, etcd1, "2:3", max_restarts=2, command=train)
    agents = [job.start(f"node{i}") for i in range(3)]
    assert wait_for(lambda: os.path.exists(snap), 120), job.output()
    host = [x for x in agents if "[g0 r0]" in x.stdout + x.stderr]
    assert len(host) == 1, job.output()
    host[0].proc.send_signal(signal.SIGKILL)
    host[0].wait(10)
    survivors = [x for x in agents if x is not host[0]]
    for x in survivors:
        assert x.wait(180) == 0, job.output()
    out = "".join(x.stdout + x.stderr for x in survivors)
    # ddp-train regroups: the survivors' workers run on, with a new worker store (regrouping
    # over etcd's rendezvous); a job whose workers cannot would resume from the snapshot.
    assert out.count("regrouped around its running workers: 2 nodes") == 2, job.output()
    assert "resuming from snapshot" not in out, job.output()


def test_a_stopped_agent_loses_its_lease_and_the_others_re_form(launcher, tmp_path, etcd1):  # noqa: F811
    job = Job(launcher, tmp_path, etcd1, "2:3")
    agents = [job.start(f"node{i}") for i in range(3)]
    with_world = lambda w: [r for r in records(job.out) if r["world"] == str(w)]
    assert wait_for(lambda: len(with_world(3)) >= 3, 60), job.output()
    frozen = agents[2]
    frozen.proc.send_signal(signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert wait_for(lambda: len(with_world(2)) >= 2, LEASE_S + MARGIN_S), job.output()
        print(f"re-formed without the stopped agent after {time.monotonic() - t0:.2f} s "
              f"(lease {LEASE_S} s)")
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
    # Thawed, it finds its lease gone, takes a new one and joins the next round.
    assert wait_for(lambda: len(with_world(3)) >= 6, 60), job.output()
    job.stop_workers()
    for a in agents:
        assert a.wait(30) == 0, job.output()
    assert {r["restarts"] for r in records(job.out)} == {"0"}  # membership is not a restart


def test_an_unreachable_cluster_is_named_within_the_timeout(launcher, tmp_path):  # noqa: F811
    from etcd_cluster import _ports
    ports = _ports(2)  # closed again: nothing listens there
    eps = ",".join(f"127.0.0.1:{p}" for p in ports)
    read_timeout_s = 2
    # "Within the timeout", with room for a loaded machine: the first etcd request gives up at
    # read_timeout; the margin covers the agent's start and exit. One that ignored read_timeout
    # (the 60 s default) would not end before it.
    bound_s = read_timeout_s + 10
    t0 = time.monotonic()
    a = launcher.start("--nnodes=2", "--rdzv-backend=etcd-v3", f"--rdzv-endpoint={eps}",
                       f"--rdzv-conf=read_timeout={read_timeout_s}", "--no-python", "/bin/true",
                       name="lonely")
    rc = a.wait(30)
    took = time.monotonic() - t0
    assert rc != 0, a.output()
    for p in ports:
        assert f"127.0.0.1:{p}" in a.stderr, a.output()
    assert "did not answer" in a.stderr, a.output()
    assert took < bound_s, f"refused after {took:.2f} s, over {bound_s} s\n{a.output()}"


def test_tls_files_for_a_plain_cluster_are_refused_by_name(launcher, tmp_path):  # noqa: F811
    # TLS itself: test_etcd_tls.py
    a = launcher.start("--nnodes=2", "--rdzv-backend=etcd-v3", "--rdzv-endpoint=127.0.0.1:1",
                       "--rdzv-conf=cacert=/etc/ca.pem", "--no-python", "/bin/true", name="tls")
    assert a.wait(30) == 2
    assert "cacert: TLS settings need https" in a.stderr


@pytest.mark.parametrize("members", [2, 3])
def test_quorum_lost_for_a_while_and_back_the_job_goes_on(launcher, tmp_path, etcd3, members):  # noqa: F811
    """Two (no quorum) or all three members stopped (SIGSTOP) for 8 s, shorter than the lease
    ttl (12 s here): the agents ride it out (issue 32): no restart, no re-form."""
    conf = ("join_timeout=40,last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=12,"
            "read_timeout=3")
    job = Job(launcher, tmp_path, etcd3, 2, conf=conf)
    a, b = job.start("nodeA"), job.start("nodeB")
    assert wait_for(lambda: len(records(job.out)) >= 2, 60), job.output()
    leader = etcd3.leader()
    stopped = ([leader] + [i for i in range(3) if i != leader])[:members]
    for i in stopped:
        os.kill(etcd3.procs[i].pid, signal.SIGSTOP)
    try:
        time.sleep(8)
        assert a.proc.poll() is None and b.proc.poll() is None, job.output()
    finally:
        for i in stopped:
            os.kill(etcd3.procs[i].pid, signal.SIGCONT)
    assert wait_for(lambda: etcd3.leader() is not None, 30), etcd3.logs()
    time.sleep(2 * LEASE_S)
    job.stop_workers()
    for x in (a, b):
        assert x.wait(60) == 0, job.output()
    recs = records(job.out)
    assert len(recs) == 2, job.output()  # one round: nobody restarted or re-formed
    assert "died or stopped answering" not in a.stderr + b.stderr, job.output()


def test_the_live_status_is_published_to_etcd(launcher, tmp_path, etcd1):  # noqa: F811
    """Issue 32: the live view works on etcd-v3: `ddprun status --rdzv-backend etcd-v3` reads
    both nodes' records from the cluster (under a key prefix), and so does an agent's own
    /api/status (the page's source)."""
    import json
    import subprocess
    import urllib.request
    conf = FAST + ",key_prefix=/team-a"
    job = Job(launcher, tmp_path, etcd1, 2, conf=conf)
    job.args.insert(0, "--http-port=0")
    a, b = job.start("nodeA"), job.start("nodeB")
    assert wait_for(lambda: len(records(job.out)) >= 2, 60), job.output()
    status = [os.path.join(BIN, "ddprun"), "status", "--rdzv-backend", "etcd-v3",
              "--rdzv-endpoint", etcd1.endpoint_list, "--rdzv-conf", "key_prefix=/team-a",
              "--run-id", job.run_id, "--json"]

    def both_running():
        r = subprocess.run(status, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            return False
        nodes = json.loads(r.stdout)["nodes"]
        return len(nodes) == 2 and all(
            n["state"] == "running" and [x["state"] for x in n["ranks"]] == ["running"]
            for n in nodes)
    assert wait_for(both_running, 30, interval=0.5), job.output()
    # Without the key prefix the job is not there: the records live under it.
    r = subprocess.run(status[:6] + status[8:], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "no" in r.stderr.lower(), r.stdout + r.stderr
    m = re.search(r"ddprun: live view at http://([^/:\s]+):(\d+)/", a.stderr)
    assert m, a.output()
    url = f"http://{m.group(1)}:{m.group(2)}/api/status"

    def both_on_the_page():  # the agent's page reads the whole job from the cluster
        job_ = json.loads(urllib.request.urlopen(url, timeout=5).read().decode())
        return sorted(n["host"] for n in job_["nodes"]) and len(job_["nodes"]) == 2
    assert wait_for(both_on_the_page, 30, interval=0.5), job.output()
    job.stop_workers()
    for x in (a, b):
        assert x.wait(60) == 0, job.output()
