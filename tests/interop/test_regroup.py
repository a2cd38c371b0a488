"""Regrouping (issue 34, part 3): an elastic ddp-train job (--nnodes 2:3, 2 ranks a node, ddprund
as the store) goes on around its running workers. A node SIGKILLed mid-run (its agent and its
workers together) shrinks the job at once: the survivors' processes keep running, drop the step
in flight, take their new ranks from their agents' regroup line and train on as a world of 4. A
node that joins grows it: the running ranks keep their processes and the new node's ranks take
their state from them (no disk read). Neither is a restart. Every run is bounded (timeouts), its
files in the test's tmp_path, and no process may outlive it."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import Daemon
from ddprun_multinode_helpers import DDPRUN, agent_env, popen_retry, wait_for

BIN = os.path.dirname(DDPRUN)
TRAIN = os.path.join(BIN, "ddp-train")
STEP = re.compile(r"epoch (\d+)/\d+ step (\d+)/(\d+) ")


@pytest.fixture
def store():
    d = Daemon()
    yield d
    d.stop()


class Node:
    """One ddprun agent in a session of its own (a node: killpg ends it and its workers)."""

    def __init__(self, tmp_path, name, argv, env=None):
        self.log = open(tmp_path / f"{name}.log", "w+")
        self.proc = popen_retry(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=agent_env(env or {}),
                                start_new_session=True)

    def text(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def workers(self):
        """The agent's ddp-train children, by pid."""
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                kids = [int(p) for p in f.read().split()]
        except OSError:
            return set()
        out = set()
        for k in kids:
            try:
                with open(f"/proc/{k}/comm") as f:
                    if f.read().strip() == "ddp-train":
                        out.add(k)
            except OSError:
                pass
        return out

    def steps(self):
        return [(int(m.group(1)), int(m.group(2))) for m in STEP.finditer(self.text())]

    def kill(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def finish(self, timeout=180):
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def leftovers(tag):
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if tag.encode() in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def argv(store, tmp_path, name, epochs, max_restarts=0):
    metrics = tmp_path / f"{name}.json"
    return [DDPRUN, "--nnodes=2:3", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{store.port}", f"--rdzv-id={name}",
            "--rdzv-conf=last_call_timeout=1", f"--max-restarts={max_restarts}", "--no-python",
            TRAIN,
            str(epochs), "1", "--model", "mlp", "--train-subset", "6000", "--threads", "1",
            "--no-eval", "--log-every", "1", "--snapshot", str(tmp_path / f"{name}.ddp"),
            "--metrics-json", str(metrics)], metrics


def end(nodes, metrics):
    """Whatever is still running is killed; then no process of the job may be left."""
    for n in nodes:
        if n.proc.poll() is None:
            os.killpg(n.proc.pid, signal.SIGKILL)
            n.proc.wait()
    assert leftovers(str(metrics)) == []


def test_a_lost_node_shrinks_the_job_around_the_running_workers(store, tmp_path):
    cmd, metrics = argv(store, tmp_path, "shrink", 6)
    nodes = []
    try:
        for i in range(3):
            nodes.append(Node(tmp_path, f"shrink{i}", cmd))
            time.sleep(0.2)
        text = lambda: "\n".join(n.text() for n in nodes)
        assert wait_for(lambda: any(e >= 2 for e, _ in nodes[0].steps()), 120), text()
        # --max-restarts=0: a restart would end the job; regrouping is not one.
        victim = next(n for n in nodes[1:] if "[default0]:ddp-train: mlp" not in n.text())
        survivors = [n for n in nodes if n is not victim]
        before = [n.workers() for n in survivors]
        assert all(len(w) == 2 for w in before), (before, text())
        victim.kill()
        assert wait_for(lambda: all("regrouped in" in n.text() for n in survivors), 60), text()
        assert [n.workers() for n in survivors] == before, text()  # the same processes
        codes = [n.finish() for n in survivors]
        out = "\n".join(n.text() for n in survivors)
        assert codes == [0, 0], out
        assert out.count("regrouped around its running workers: 2 nodes, 4 ranks") == 2, out
        assert "the workers keep running (regrouping)" in out
        assert "resuming from snapshot" not in out, out  # nothing read from the disk
        assert out.count("mlp (235146 parameters)") == 1, out  # rank 0 started once
        assert re.search(r"restarts +0 \(failures: 1 node lost\)", out), out
        m = json.loads(metrics.read_text())
        assert m["world_size"] == 4, m
        assert m["epochs_run"] == 6 and m["final_loss"] < 1.0, m
    finally:
        end(nodes, metrics)


def test_a_node_that_joins_grows_the_job_and_heals_from_the_running_ranks(store, tmp_path):
    cmd, metrics = argv(store, tmp_path, "grow", 8)
    nodes = []
    try:
        for i in range(2):
            nodes.append(Node(tmp_path, f"grow{i}", cmd))
            time.sleep(0.2)
        text = lambda: "\n".join(n.text() for n in nodes)
        assert wait_for(lambda: any(e >= 2 for e, _ in nodes[0].steps()), 120), text()
        before = [n.workers() for n in nodes]
        nodes.append(Node(tmp_path, "grow2", cmd))
        assert wait_for(lambda: all("regrouped in" in n.text() for n in nodes[:2]), 60), text()
        assert [n.workers() for n in nodes[:2]] == before, text()
        codes = [n.finish() for n in nodes]
        out = text()
        assert codes == [0, 0, 0], out
        assert out.count("regrouped around its running workers: 3 nodes, 6 ranks") == 2, out
        new = nodes[2].text()
        assert new.count("no disk read") == 2, new  # both new ranks, from a running one
        assert "resuming from snapshot" not in out, out
        assert re.search(r"restarts +0 \(failures: 1 node joined\)", out), out
        m = json.loads(metrics.read_text())
        assert m["world_size"] == 6, m
        assert m["epochs_run"] == 8 and m["final_loss"] < 1.0, m
    finally:
        end(nodes, metrics)


def test_a_rank_that_dies_after_a_regroup_is_healed_in_the_new_group(store, tmp_path):
    """A node lost (regroup to 4 ranks), then rank 1 of the new group killed at global step 200
    (DDP_TRAIN_FAULT counts the new ranks): its replacement joins the regrouped group's namespace
    (DDPRUN_JOIN_ROUND with DDPRUN_HEAL) and is healed from a peer; the job ends."""
    cmd, metrics = argv(store, tmp_path, "both", 8, max_restarts=1)
    nodes = []
    try:
        for i in range(3):
            nodes.append(Node(tmp_path, f"both{i}", cmd, {"DDP_TRAIN_FAULT": "1:200:kill"}))
            time.sleep(0.2)
        text = lambda: "\n".join(n.text() for n in nodes)
        # Kill a node that holds neither rank 0 nor rank 1, early in epoch 2 (step 32 or so).
        assert wait_for(lambda: any(e >= 2 for e, _ in nodes[0].steps()), 120), text()
        victim = next(n for n in nodes[1:] if "[default0]:ddp-train: mlp" not in n.text())
        victim.kill()
        survivors = [n for n in nodes if n is not victim]
        codes = [n.finish() for n in survivors]
        out = "\n".join(n.text() for n in survivors)
        assert codes == [0, 0], out
        assert out.count("regrouped around its running workers: 2 nodes, 4 ranks") == 2, out
        assert "rank 1 kills itself at step 200" in out, out
        assert "replaced in place, the others go on (heal 1;" in out, out
        assert "no disk read" in out, out
        assert "resuming from snapshot" not in out, out
        m = json.loads(metrics.read_text())
        assert m["world_size"] == 4 and m["epochs_run"] == 8, m
    finally:
        end(nodes, metrics)
