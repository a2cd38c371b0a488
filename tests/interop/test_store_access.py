"""The workers' store of a round admits the round's nodes and no one else (issue 22,
docs/security.md). Two network namespaces made by this test (each held by an `unshare -n`
sleeper, joined by a veth pair on 10.231.0.0/24; nothing else is reachable from them, and
they vanish with their sleepers): a one-node ddprun job in namespace A whose worker, an
unmodified torch 2.x TCPStore client, uses MASTER_ADDR:MASTER_PORT; and a peer in namespace
B whose torch client the same store refuses. With the job's secret the rendezvous store
refuses B too; --store-allow admits B. Every wait is bounded; processes are ended by PID."""
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import BIN

DDPRUN = os.path.join(BIN, "ddprun")
NET = "10.231.0"

WORKER = r"""
import datetime, os, time
import torch.distributed as dist
out = os.environ["OUT"]
s = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                  timeout=datetime.timedelta(seconds=30))
s.set("/from-worker", "ok")
with open(out + "/master.tmp", "w") as f:
    f.write(os.environ["MASTER_ADDR"] + " " + os.environ["MASTER_PORT"])
os.rename(out + "/master.tmp", out + "/master")
for _ in range(1200):
    if os.path.exists(out + "/stop"):
        break
    time.sleep(0.05)
"""

# A torch client on another node: 'served' when the store answers, else 'refused'.
PROBE = r"""
import datetime, sys
import torch.distributed as dist
try:
    s = dist.TCPStore(sys.argv[1], int(sys.argv[2]), is_master=False,
                      timeout=datetime.timedelta(seconds=3))
    print("served", s.get("/from-worker").decode() if sys.argv[3] == "get" else s.num_keys())
except Exception as e:
    print("refused", type(e).__name__)
"""


def run(*args, timeout=20):
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=True)


class Netns:
    """A namespace held by a sleeper; commands run in it through nsenter."""

    def __init__(self):
        self.holder = subprocess.Popen(["unshare", "-n", "sleep", "600"])
        mine = os.readlink("/proc/self/ns/net")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{self.holder.pid}/ns/net") == mine:
            assert time.monotonic() < deadline, "unshare -n did not take effect"
            time.sleep(0.01)

    def cmd(self, *args):
        return ["nsenter", "-t", str(self.holder.pid), "-n", "--", *args]

    def close(self):
        self.holder.kill()
        self.holder.wait()


@pytest.fixture
def two_nodes():
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make network namespaces here (needs root)")
    a, b = Netns(), Netns()
    try:
        va, vb = f"ddpa{os.getpid() % 100000}", f"ddpb{os.getpid() % 100000}"
        run("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        run("ip", "link", "set", va, "netns", str(a.holder.pid))
        run("ip", "link", "set", vb, "netns", str(b.holder.pid))
        for ns, dev, ip in ((a, va, f"{NET}.1"), (b, vb, f"{NET}.2")):
            run(*ns.cmd("ip", "link", "set", "lo", "up"))
            run(*ns.cmd("ip", "addr", "add", f"{ip}/24", "dev", dev))
            run(*ns.cmd("ip", "link", "set", dev, "up"))
        yield a, b
    finally:
        a.close()
        b.close()


class Job:
    def __init__(self, ns, tmp_path, *flags, secret=None):
        self.out = str(tmp_path / f"out{len(os.listdir(tmp_path))}")
        os.makedirs(self.out)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DDPRUN_STORE_SECRET")}
        env["OUT"] = self.out
        if secret:
            env["DDPRUN_STORE_SECRET"] = secret
        self.log = open(os.path.join(self.out, "agent.log"), "w+")
        self.proc = subprocess.Popen(
            ns.cmd(DDPRUN, "--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
                   f"--rdzv-endpoint={NET}.1:29400", f"--local-addr={NET}.1", *flags,
                   "--no-python", sys.executable, "-c", WORKER),
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        path = os.path.join(self.out, "master")
        while not os.path.exists(path):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.output()
            time.sleep(0.05)
        self.addr, self.port = open(path).read().split()

    def output(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        open(os.path.join(self.out, "stop"), "w").close()
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        assert rc == 0, self.output()


def probe(ns, host, port, what="get"):
    r = subprocess.run(ns.cmd(sys.executable, "-c", PROBE, host, str(port), what),
                       capture_output=True, text=True, timeout=60)
    return r.stdout.strip()


def test_the_workers_store_admits_the_rounds_nodes_only(two_nodes, tmp_path):
    a, b = two_nodes
    job = Job(a, tmp_path)
    try:
        assert job.addr == f"{NET}.1"
        assert probe(a, job.addr, job.port) == "served ok"  # a node of the round (and its worker)
        assert probe(b, job.addr, job.port).startswith("refused"), job.output()
        # Without a secret the c10d rendezvous store stays open, as torch's: agents of new
        # nodes must reach it before any round knows them (docs/security.md).
        assert probe(b, job.addr, 29400, "num_keys").startswith("served")
    finally:
        job.stop()
    assert "refused a connection from 10.231.0.2" in job.output()


def test_with_the_jobs_secret_an_outsider_reaches_neither_store(two_nodes, tmp_path):
    a, b = two_nodes
    job = Job(a, tmp_path, secret="job-secret-" + os.urandom(8).hex())
    try:
        assert probe(b, job.addr, job.port).startswith("refused"), job.output()
        assert probe(b, job.addr, 29400, "num_keys").startswith("refused")
        assert probe(a, job.addr, job.port) == "served ok"
    finally:
        job.stop()


def test_store_allow_admits_another_network(two_nodes, tmp_path):
    a, b = two_nodes
    job = Job(a, tmp_path, f"--store-allow={NET}.2/32")
    try:
        assert probe(b, job.addr, job.port) == "served ok", job.output()
    finally:
        job.stop()
