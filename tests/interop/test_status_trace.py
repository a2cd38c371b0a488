"""The trace file and the terminal text of a real 2-agent job (issue 18): ddprund and two
ddprun agents on 127.0.0.1, ddp-train workers for a few dozen steps, one worker killed by an
injected fault and the job restarted once (--max-restarts 1). Checks the Chrome trace written
by the group-rank-0 node (valid JSON, both nodes as processes, the launcher phases, each rank's
steps, events in time order), the exit summary on stderr (wall time, the restart and its cause,
each rank's exit) and, with --progress lines on a non-TTY stderr, plain progress lines."""
import json
import re
import uuid

from conftest import Daemon
from ddp_train_helpers import TRAIN, needs_ddp_train, needs_fmnist
from ddprun_multinode_helpers import launcher  # noqa: F401 (the fixture)

pytestmark = [needs_ddp_train, needs_fmnist]

MAX_STEPS = 60
FAULT_STEP = 20
# Steps of some tens of milliseconds (Fashion-MNIST's MLP, 1024 samples per rank and step), so
# that the job runs for seconds and the agents see it running; no snapshot, so the restarted
# run starts over and the total stays MAX_STEPS.
WORK = ["--train-subset", "8192", "--batch-size", "1024", "--threads", "1", "--no-eval",
        "--max-steps", str(MAX_STEPS), "--snapshot", "", "--recovery", "restart"]
PROGRESS = re.compile(r"^ddprun: step (\d+)(?:/(\d+))?(?: \| .*)?$", re.M)


def summary_of(stderr):
    """The exit summary: from 'ddprun: summary' to the end of stderr."""
    at = stderr.find("ddprun: summary")
    assert at >= 0, "no exit summary in:\n" + stderr
    return stderr[at:]


def rank_rows(summary):
    """{rank: (state, exit)} from the summary's rank table."""
    lines = summary.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["rank", "node"])
    rows = {}
    for ln in lines[head + 1:]:
        m = re.match(r"^\s+(\d+)\s+\S+ \(slot \d+\)\s+\d+\s+(\w+)\s+\d+\s+\S+\s+(\S+)", ln)
        if not m:
            break
        rows[int(m.group(1))] = (m.group(2), m.group(3))
    return rows


def test_trace_summary_and_progress_of_a_restarted_two_node_job(launcher, tmp_path):  # noqa: F811
    d = Daemon("--http-port", "-1")
    launcher.daemons.append(d)
    trace = tmp_path / "trace.json"
    run_id = "trace-" + uuid.uuid4().hex[:8]
    argv = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{d.port}", f"--rdzv-id={run_id}", "--max-restarts=1",
            "--rdzv-conf=join_timeout=60", f"--trace={trace}", "--progress=lines",
            "--status-interval=0.2", "--no-python", TRAIN, "100", "0", *WORK]
    # Global rank 1 kills itself at step FAULT_STEP on the first attempt only.
    env = {"DDP_TRAIN_FAULT": f"1:{FAULT_STEP}", "OMP_NUM_THREADS": "1"}
    a = launcher.start(*argv, name="nodeA", env=env)
    b = launcher.start(*argv, name="nodeB", env=env)
    logs = lambda: a.output() + "\n" + b.output() + "\n--- ddprund:\n" + d.output()  # noqa: E731
    assert a.wait(240) == 0 and b.wait(240) == 0, logs()
    assert "DDP_TRAIN_FAULT" in a.stdout + b.stdout, logs()  # the fault did fire

    # The trace: written once, by the group-rank-0 node, valid JSON.
    assert trace.exists(), logs()
    doc = json.loads(trace.read_text())
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]
    assert events, doc
    meta = [e for e in events if e["ph"] == "M"]
    spans = [e for e in events if e["ph"] == "X"]
    # Both nodes, as two processes with their names.
    pids = {e["pid"] for e in spans}
    assert len(pids) == 2, pids
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert set(procs) == pids and all(n.startswith("node ") for n in procs.values()), procs
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert all(threads.get((p, 0)) == "launcher" for p in pids), threads
    # The launcher phases, on each node the first three, and the restart somewhere.
    for p in pids:
        names = {e["name"] for e in spans if e["pid"] == p and e["cat"] == "launcher"}
        assert {"rendezvous", "spawn", "run"} <= names, (p, names)
    assert any(e["name"] == "restart" for e in spans if e["cat"] == "launcher"), spans[:50]
    # Steps on every rank's thread: four ranks, each with steps past the restart's.
    steps = [e for e in spans if e["cat"] == "step"]
    by_rank = {}
    for e in steps:
        assert e["name"] == f"step {e['args']['step']}", e
        assert e["tid"] >= 1 and (e["pid"], e["tid"]) in threads, e
        assert threads[(e["pid"], e["tid"])].startswith(f"rank {e['args']['rank']} "), e
        by_rank.setdefault(e["args"]["rank"], []).append(e["args"]["step"])
    assert set(by_rank) == {0, 1, 2, 3}, sorted(by_rank)
    for r, s in by_rank.items():
        assert max(s) >= FAULT_STEP, (r, max(s))
    # One clock, in order.
    ts = [e["ts"] for e in spans]
    assert ts == sorted(ts), "events out of order"
    assert ts[0] == 0 and all(e["dur"] >= 0 for e in spans)
    assert events.index(meta[-1]) < events.index(spans[0])  # metadata first

    # The exit summary on each agent's stderr.
    for agent in (a, b):
        s = summary_of(agent.stderr)
        assert re.search(r"^\s+wall time\s+\d", s, re.M), s
        assert re.search(r"^\s+final state\s+succeeded, exit code 0", s, re.M), s
        m = re.search(r"^\s+restarts\s+1\b(.*)$", s, re.M)
        assert m, s
        # and its cause, in words
        assert re.search(r"^\s+round \d+: (killed by a signal|non-zero exit): ", s, re.M), s
        rows = rank_rows(s)
        assert set(rows) == {0, 1, 2, 3}, s
        assert all(st == "succeeded" and ex == "0" for st, ex in rows.values()), s

    # Plain progress lines (stderr is a file, not a TTY): step/total, never a redraw.
    err = a.stderr + b.stderr
    assert "\r" not in err and "\033[K" not in err
    lines = PROGRESS.findall(err)
    assert lines, "no progress line in:\n" + logs()
    assert all(total == str(MAX_STEPS) for _, total in lines), lines
