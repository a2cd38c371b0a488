"""The agents' live status records (issue 18), checked against the truth: two c10d agents on this
machine publish their records to the rendezvous store; the records name the real worker pids,
their progress, CPU and memory; a worker killed by the test shows as a restart with its cause on
the right node, and the final records say how the job ended. Also the flags' refusals and the
summary at exit. Records are read straight from the store with torch's own TCPStore client."""
import json
import os
import signal
import sys
import textwrap
import time
import uuid
from datetime import timedelta

import pytest

from ddprun_multinode_helpers import (DDPRUN, free_port, gone, launcher, listening,  # noqa: F401
                                      wait_for)

torch_dist = pytest.importorskip("torch.distributed")

# A worker that reports a step every 50 ms on ddprun's progress pipe until STOP_FILE exists.
WORKER = textwrap.dedent("""
    import os, sys, time
    fd = int(os.environ["DDPRUN_PROGRESS_FD"])
    stop = os.environ["STOP_FILE"]
    with open(os.path.join(os.environ["PID_DIR"], os.environ["RANK"] + "." + str(os.getpid())), "w"):
        pass
    step = 0
    while not os.path.exists(stop):
        os.write(fd, f"step={step} samples=32 total=100000\\n".encode())
        step += 1
        x = sum(i * i for i in range(20000))  # some CPU
        time.sleep(0.05)
""")


def store_client(port):
    return torch_dist.TCPStore("127.0.0.1", port, is_master=False, use_libuv=False,
                               timeout=timedelta(seconds=10))


def read_job(store, run_id):
    """{slot: record} as job_view.hpp lays them out."""
    index = f"ddprun/status/{run_id}/index"
    if not store.check([index]):
        return {}
    slots = sorted({int(s) for s in store.get(index).decode().split(",") if s})
    return {s: json.loads(store.get(f"ddprun/status/{run_id}/node/{s}")) for s in slots}


def ranks_of(job):
    return {r["rank"]: (rec, r) for rec in job.values() for r in rec["ranks"]}


@pytest.fixture
def job(launcher, tmp_path):  # noqa: F811
    """Two c10d agents x 2 workers of WORKER, --max-restarts 1; yields (port, run_id, agents)."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    port = free_port()
    run_id = "status-" + uuid.uuid4().hex[:8]
    common = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}",
              "--rdzv-conf=join_timeout=60", "--max-restarts=1", "--status-interval=0.2",
              "--progress=lines", str(script)]
    env = {"STOP_FILE": str(tmp_path / "stop"), "PID_DIR": str(pid_dir)}
    a = launcher.start(*common, name="nodeA", env=env)
    assert wait_for(lambda: listening(port) or a.proc.poll() is not None, 30), a.output()
    b = launcher.start(*common, name="nodeB", env=env)
    yield port, run_id, (a, b), tmp_path
    (tmp_path / "stop").write_text("")


def test_records_tell_the_truth_through_a_restart(job):
    port, run_id, agents, tmp_path = job
    store = store_client(port)

    def settled():
        j = read_job(store, run_id)
        rs = ranks_of(j)
        return len(j) == 2 and len(rs) == 4 and all(
            r["state"] == "running" and r["step"] >= 3 and r["step_time_s"] > 0
            for _, r in rs.values())

    assert wait_for(settled, 60, 0.1), \
        f"{read_job(store, run_id)}\n{agents[0].output()}\n{agents[1].output()}"
    job0 = read_job(store, run_id)
    assert {rec["agent_pid"] for rec in job0.values()} == {a.pid for a in agents}
    assert {rec["group_rank"] for rec in job0.values()} == {0, 1}
    for rank, (rec, r) in ranks_of(job0).items():
        assert rec["state"] == "running" and rec["world_size"] == 4
        assert not gone(r["pid"]), r
        with open(f"/proc/{r['pid']}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        assert env[b"RANK"] == str(rank).encode()
        assert env[b"LOCAL_RANK"] == str(r["local_rank"]).encode()
        assert r["total_steps"] == 100000 and r["step_time_s"] > 0
        assert r["samples_per_s"] > 0
    # /proc figures arrive with the next interval.
    assert wait_for(lambda: all(r["rss_bytes"] > 1 << 20 and r["cpu"] >= 0
                                for _, r in ranks_of(read_job(store, run_id)).values()), 10, 0.1)
    seq = {s: rec["seq"] for s, rec in job0.items()}
    time.sleep(1)
    assert all(rec["seq"] > seq[s] for s, rec in read_job(store, run_id).items())

    # Kill rank 3's worker: a restart caused by a signal, counted on its node only.
    victim_rec, victim = ranks_of(job0)[3]
    os.kill(victim["pid"], signal.SIGKILL)

    def restarted():
        j = read_job(store, run_id)
        rs = ranks_of(j)
        return len(rs) == 4 and all(rec["restart_count"] == 1 and r["state"] == "running"
                                    for rec, r in rs.values())

    assert wait_for(restarted, 60, 0.1), \
        f"{read_job(store, run_id)}\n{agents[0].output()}\n{agents[1].output()}"
    job1 = read_job(store, run_id)
    for slot, rec in job1.items():
        assert rec["restarts"] and rec["restarts"][-1]["cause"] == "signal", rec["restarts"]
        mine = rec["agent_pid"] == victim_rec["agent_pid"]
        assert rec["failures_by_cause"] == ({"signal": 1} if mine else {}), rec
        names = [p["name"] for p in rec["phases"]]
        assert names[:3] == ["rendezvous", "spawn", "run"] and "restart" in names, names
    new = ranks_of(job1)
    assert new[3][1]["pid"] != victim["pid"] and not gone(new[3][1]["pid"])
    assert new[3][1]["restarts"] == 1
    assert new[3][1]["last_exit"] == -9 and "SIGKILL" in new[3][1]["last_error"]

    (tmp_path / "stop").write_text("")
    for a in agents:
        assert a.wait(60) == 0, a.output()
    final = read_job(store_client(port), run_id) if listening(port) else None
    for a in agents:
        err = a.stderr
        assert "ddprun: summary of run " + run_id in err, err
        assert "restarts     1" in err, err
        assert "ddprun: step " in err, err  # --progress lines: plain progress lines
    if final:  # the host's store may be gone already: then the summaries above suffice
        assert all(rec["state"] == "succeeded" for rec in final.values()), final


@pytest.mark.parametrize("flag,needle", [
    ("--status-interval=0.05", "--status-interval"),
    ("--status-interval=abc", "--status-interval"),
    ("--http-port=70000", "--http-port"),
    ("--progress=sometimes", "--progress"),
])
def test_bad_status_flags_are_refused_by_name(flag, needle, tmp_path):
    import subprocess
    p = subprocess.run([DDPRUN, "--standalone", flag, "--no-python", "/bin/true"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, p
    assert needle in p.stderr, p.stderr


def test_status_off_publishes_nothing_and_progress_off_prints_no_summary(tmp_path):
    import subprocess
    script = tmp_path / "w.py"
    script.write_text("import os\nos.write(int(os.environ['DDPRUN_PROGRESS_FD']), b'step=1\\n')\n")
    p = subprocess.run([DDPRUN, "--standalone", "--status-interval=0", "--progress=off",
                        "--nproc-per-node=1", str(script)], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, PYTHON_EXEC=sys.executable))
    assert p.returncode == 0, p.stderr
    assert "summary of run" not in p.stderr and "ddprun: step" not in p.stderr
    p = subprocess.run([DDPRUN, "--standalone", "--nproc-per-node=1", str(script)],
                       capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, PYTHON_EXEC=sys.executable))
    assert p.returncode == 0, p.stderr
    assert "summary of run" in p.stderr and "succeeded" in p.stderr, p.stderr


# A worker whose progress lines carry every kind of bad metric (issue 36): a word, infinity, a
# bad name, 5000 keys on one line (cut at the line's bound), 40 names over its lines (16 kept),
# and a line of 100 kB (dropped whole). Its steps still count.
BAD_METRICS_WORKER = textwrap.dedent("""
    import os
    fd = int(os.environ["DDPRUN_PROGRESS_FD"])
    def put(line):
        os.write(fd, (line + "\\n").encode())
    put("step=1 loss=abc")
    put("step=2 lr=inf 9bad=1 ok=1.5")
    put("step=3 " + " ".join(f"k{i}=1" for i in range(5000))[:3900])
    for i in range(40):
        put(f"step={4 + i} m{i}={i}")
    put("step=44 " + "x" * 100000)
    put("step=45 loss=0.25")
    import time; time.sleep(2)
""")


def test_bad_metrics_are_bounded_and_named(tmp_path):
    script = tmp_path / "bad_metrics.py"
    script.write_text(BAD_METRICS_WORKER)
    port = free_port()
    run_id = "bad-metrics-" + uuid.uuid4().hex[:6]
    from ddprun_multinode_helpers import popen_retry
    import subprocess
    p = popen_retry([DDPRUN, "--standalone", "--nproc-per-node=1", f"--rdzv-id={run_id}",
                     "--rdzv-endpoint", f"127.0.0.1:{port}", "--status-interval=0.2",
                     "--progress=off", sys.executable, str(script)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"the job did not end:\n{out}{err}")
    assert p.returncode == 0, err
    # Named once, with why; the rest only counted.
    named = [l for l in err.splitlines() if "progress metric" in l]
    assert named == ["ddprun: local rank 0: progress metric 'loss=abc': not a finite number; "
                     "dropped (the rest are counted: ddprun_rank_bad_metrics_total)"], err
