"""`ddprun status` (issue 18) against a real ddprund: (a) records written by torch's own
TCPStore client, so that every field is known: --json validates against
docs/status.schema.json and says what was written, the table shows it, --watch prints until
SIGINT/SIGTERM, and the errors exit 1 (unknown run, unreachable store) or 2 (bad flags);
(b) a real 2-agent ddp-train job, checked against the truth from /proc while it runs and after
one of its workers is killed and the job restarts."""
import datetime
import json
import os
import pty
import select
import signal
import subprocess
import time
import uuid

import jsonschema
import pytest
from torch.distributed import TCPStore

from conftest import BIN, Daemon, popen_retry
from ddp_train_helpers import TRAIN, needs_ddp_train
from ddprun_multinode_helpers import free_port, launcher, wait_for  # noqa: F401 (fixture)

DDPRUN = os.path.join(BIN, "ddprun")
SCHEMA_PATH = os.path.join(os.path.dirname(__file__), "../../docs/status.schema.json")
with open(SCHEMA_PATH) as f:
    SCHEMA = json.load(f)
jsonschema.Draft202012Validator.check_schema(SCHEMA)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


# ----------------------------------------------------------------------------------- helpers

def rank_record(local, rank, pid, **kw):
    r = {"local_rank": local, "rank": rank, "pid": pid, "state": "running", "restarts": 0,
         "last_exit": None, "last_error": "", "step": -1, "step_time_s": 0.0,
         "samples_per_s": 0.0, "total_steps": -1, "cpu": 0.0, "rss_bytes": 0, "gpu": -1,
         "gpu_util": None, "gpu_mem_used": None, "gpu_mem_total": None}
    r.update(kw)
    return r


def node_record(run, host, slot, updated, ranks, **kw):
    n = {"schema": 1, "run_id": run, "job_id": "", "host": host, "slot": slot,
         "agent_pid": 4000 + slot, "state": "running", "round": 2, "group_rank": slot,
         "group_world_size": 2, "world_size": 4, "restart_count": 2, "max_restarts": 3,
         "started": updated - 60, "updated": updated, "interval_s": 1.0, "seq": 7,
         "ranks": ranks, "restarts": [], "failures_by_cause": {}, "phases": []}
    n.update(kw)
    return n


def synthetic_job(port, run):
    """Writes a 2-node job as agents would (job_view.hpp): slot 0 fresh (one GPU rank, one
    failed rank with a long error), slot 1 silent for 100 s (lost). Returns the records."""
    now = time.time()
    nodes = [
        node_record(run, "host-a", 0, now, [
            rank_record(0, 0, 51001, step=57, total_steps=100, step_time_s=0.25,
                        samples_per_s=512.0, cpu=0.97, rss_bytes=300 << 20, gpu=0,
                        gpu_util=0.5, gpu_mem_used=2 << 30, gpu_mem_total=16 << 30,
                        restarts=2),
            rank_record(1, 1, 51002, state="failed", last_exit=-9, restarts=2,
                        last_error="signal 9 (SIGKILL) " + "z" * 100)],
            restarts=[{"round": 1, "at": now - 5, "cause": "signal",
                       "what": "local rank 1 was killed by signal 9"}],
            failures_by_cause={"signal": 2},
            phases=[{"name": "rendezvous", "start": now - 60, "end": now - 59, "detail": ""},
                    {"name": "run", "start": now - 59, "end": 0.0, "detail": "round 2"}]),
        node_record(run, "host-b", 1, now - 100, [
            rank_record(0, 2, 52001, step=50), rank_record(1, 3, 52002, step=51)]),
    ]
    # torch's client puts "/" before each key: "/ddprun/status/...", as job_view.hpp has them.
    s = TCPStore("127.0.0.1", port, is_master=False, use_libuv=False,
                 timeout=datetime.timedelta(seconds=10))
    for n in nodes:
        s.set(f"ddprun/status/{run}/node/{n['slot']}", json.dumps(n))
    s.set(f"ddprun/status/{run}/index", "1,0,")
    s.append("ddprun/status/runs", "an-older-run\n")
    s.append("ddprun/status/runs", f"{run}\n")
    assert s.get("ddprun/status/runs").decode().endswith(run + "\n")  # all applied
    return nodes


def status(*args, timeout=30):
    p = popen_retry([DDPRUN, "status", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        pytest.fail(f"ddprun status {' '.join(args)} did not finish in {timeout} s:\n{out}{err}")
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def status_json(port, *args):
    p = status(f"--rdzv-endpoint=127.0.0.1:{port}", "--json", *args)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    VALIDATOR.validate(doc)
    return doc


def undocumented_keys(doc, schema=SCHEMA, path="job"):
    """Keys the output has and the schema does not describe (it allows them, for later
    versions; this version must describe all of its own)."""
    if "$ref" in schema:
        schema = SCHEMA["$defs"][schema["$ref"].split("/")[-1]]
    out = []
    if isinstance(doc, dict) and "properties" in schema:
        for k, v in doc.items():
            if k not in schema["properties"]:
                out.append(f"{path}.{k}")
            else:
                out += undocumented_keys(v, schema["properties"][k], f"{path}.{k}")
    elif isinstance(doc, list) and "items" in schema:
        for i, v in enumerate(doc):
            out += undocumented_keys(v, schema["items"], f"{path}[{i}]")
    return out


TITLES = ["NODE", "RANK", "LOCAL", "STATE", "RESTARTS", "STEP", "STEP TIME", "SAMPLES/S", "CPU",
          "RSS", "GPU", "METRICS", "LAST ERROR"]
LEFT = {"NODE", "STATE", "GPU", "METRICS", "LAST ERROR"}  # the others are right-aligned


def table_rows(text):
    """(header line, rank rows as {title: cell}): a left-aligned cell starts under its title,
    a right-aligned one ends under its title's end; cells never hold two spaces in a row."""
    lines = text.rstrip("\n").split("\n")
    # The job line ("job  step ...") sits between the header and the titles once steps come.
    ti = 2 if lines[1].startswith("job  ") else 1
    assert lines[ti].startswith("NODE"), text
    rows = []
    for line in lines[ti + 1:]:
        row = {}
        for t in TITLES:
            at = lines[ti].index(t)
            if t == "LAST ERROR":
                row[t] = line[at:].strip()
            elif t in LEFT:
                seg = line[at:]
                row[t] = seg[:seg.find("  ")].strip() if "  " in seg else seg.strip()
            else:
                seg = line[:at + len(t)]
                row[t] = seg[seg.rfind("  ") + 2:].strip()
        rows.append(row)
    return lines[0], rows


@pytest.fixture
def job(daemon):
    run = "synth-" + uuid.uuid4().hex[:8]
    return daemon.port, run, synthetic_job(daemon.port, run)


# --------------------------------------------------------------- (a) synthetic records

def test_json_validates_and_says_what_was_written(job):
    port, run, nodes = job
    doc = status_json(port)  # the newest run by default
    assert undocumented_keys(doc) == []
    assert doc["run_id"] == run and doc["schema"] == 1
    assert [n["host"] for n in doc["nodes"]] == ["host-a", "host-b"]  # by slot
    assert [n["lost"] for n in doc["nodes"]] == [False, True]
    assert (doc["state"], doc["round"], doc["members"], doc["ranks"], doc["restarts"]) == \
        ("running", 2, 1, 2, 2)
    a, b = doc["nodes"]
    for got, wrote in zip(a["ranks"], nodes[0]["ranks"]):
        # Records written without metrics (an agent before issue 36) read as none reported.
        got = dict(got)
        assert (got.pop("metrics"), got.pop("bad_metrics")) == ({}, 0)
        assert got == wrote
    assert [r["state"] for r in b["ranks"]] == ["lost", "lost"]
    assert [r["pid"] for r in b["ranks"]] == [52001, 52002]
    for k in ("restarts", "failures_by_cause", "phases", "agent_pid", "seq", "updated"):
        assert a[k] == nodes[0][k], k
    assert status_json(port, f"--run-id={run}") == {
        **doc, "now": pytest.approx(doc["now"], abs=30),
        "wall_s": pytest.approx(doc["wall_s"], abs=30), "eta_s": pytest.approx(doc["eta_s"]),
        "goodput": pytest.approx(doc["goodput"], abs=0.1)}


def test_schema_rejects_what_is_not_a_status():
    good = {"schema": 1, "run_id": "r", "now": 1.0, "round": -1, "members": 0, "ranks": 0,
            "restarts": 0, "state": "unknown", "nodes": []}
    VALIDATOR.validate(good)
    for bad in ({**good, "schema": 2}, {**good, "state": "dancing"},
                {k: v for k, v in good.items() if k != "nodes"}, {**good, "round": "1"}):
        assert not VALIDATOR.is_valid(bad), bad


def test_table_shows_what_was_written(job):
    port, run, _ = job
    p = status(f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id", run)
    assert p.returncode == 0, p.stderr
    header, rows = table_rows(p.stdout)
    assert header == f"run {run}  state running  round 2  nodes 1 (1 lost)  ranks 2  restarts 2/3"
    assert len(rows) == 4, p.stdout
    assert rows[0]["NODE"] == "host-a #0" and rows[1]["NODE"] == ""
    assert rows[2]["NODE"].startswith("host-b #1 LOST (silent ")
    assert [r["RANK"] for r in rows] == ["0", "1", "2", "3"]
    assert [r["LOCAL"] for r in rows] == ["0", "1", "0", "1"]
    assert [r["STATE"] for r in rows] == ["running", "failed", "lost", "lost"]
    assert [r["STEP"] for r in rows] == ["57/100", "-", "50", "51"]
    assert rows[0]["STEP TIME"] == "250 ms" and rows[0]["SAMPLES/S"] == "512"
    assert rows[0]["CPU"] == "97%" and rows[0]["RSS"] == "300 MiB"
    assert rows[0]["GPU"] == "0 50% 2.0/16 GiB" and rows[1]["GPU"] == "-"
    assert rows[1]["LAST ERROR"].startswith("signal 9 (SIGKILL) zzz")
    assert rows[1]["LAST ERROR"].endswith("...") and len(rows[1]["LAST ERROR"]) == 60
    assert [r["RESTARTS"] for r in rows] == ["2", "2", "0", "0"]


def test_unknown_run_and_empty_store_exit_1(job):
    port, run, _ = job
    p = status(f"--rdzv-endpoint=127.0.0.1:{port}", "--run-id", "no-such-run")
    assert p.returncode == 1, p.stdout + p.stderr
    assert "no ddprun job with run id 'no-such-run'" in p.stderr, p.stderr
    assert run in p.stderr and p.stdout == ""  # the runs it has are named
    d = Daemon()
    try:
        p = status(f"--rdzv-endpoint=127.0.0.1:{d.port}")
        assert p.returncode == 1, p.stdout + p.stderr
        assert f"no ddprun job has published its status to 127.0.0.1:{d.port}" in p.stderr
    finally:
        assert d.stop() == 0, d.output()


def test_unreachable_store_exits_1():
    port = free_port()  # nothing listens there
    p = status(f"--rdzv-endpoint=127.0.0.1:{port}", "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    assert f"cannot reach the rendezvous store at 127.0.0.1:{port}: " in p.stderr, p.stderr
    assert p.stdout == ""


@pytest.mark.parametrize("args,named", [
    ([], "--rdzv-endpoint"),
    (["--rdzv-endpoint=127.0.0.1:1", "--bogus"], "--bogus"),
    (["--rdzv-endpoint=127.0.0.1:notaport"], "--rdzv-endpoint"),
    (["--rdzv-endpoint=127.0.0.1:1", "--interval=0"], "--interval"),
    (["--rdzv-endpoint=127.0.0.1:1", "--interval"], "--interval"),
    (["--rdzv-endpoint=127.0.0.1:1", "--watch=1"], "--watch"),
    (["--rdzv-endpoint=127.0.0.1:1", "stray"], "stray"),
])
def test_bad_flags_exit_2(args, named):
    p = status(*args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert named in p.stderr and "usage: ddprun status" in p.stderr, p.stderr


def test_help():
    p = status("--help")
    assert p.returncode == 0, p.stderr
    for flag in ("--rdzv-endpoint", "--run-id", "--watch", "--interval", "--json"):
        assert flag in p.stdout, p.stdout


def watch(port, tmp_path, *args):
    out = open(tmp_path / "watch.out", "w+")
    p = popen_retry([DDPRUN, "status", f"--rdzv-endpoint=127.0.0.1:{port}", "--watch",
                     "--interval=0.2", *args], stdout=out, stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL, text=True)

    def text():
        out.seek(0)
        return out.read()
    return p, text


def stop_watch(p, sig, text):
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail(f"ddprun status --watch ignored signal {sig}:\n{text()}")
    assert p.returncode == 0, err
    return text()


def test_watch_prints_tables_until_sigint(job, tmp_path):
    port, run, _ = job
    p, text = watch(port, tmp_path)
    ok = wait_for(lambda: text().count(f"run {run}  ") >= 3 or p.poll() is not None, 30)
    out = stop_watch(p, signal.SIGINT, text)
    assert ok, out
    assert "\x1b[" not in out  # not a terminal: no escapes
    tables = out.rstrip("\n").split("\n\n")
    assert len(tables) >= 3, out
    for t in tables:
        header, rows = table_rows(t + "\n")
        assert header.startswith(f"run {run}  state running"), t
        assert len(rows) == 4, t


def test_watch_json_lines_until_sigterm(job, tmp_path):
    port, run, _ = job
    p, text = watch(port, tmp_path, "--json", f"--run-id={run}")
    ok = wait_for(lambda: text().count("\n") >= 2 or p.poll() is not None, 30)
    out = stop_watch(p, signal.SIGTERM, text)
    assert ok, out
    lines = out.strip().split("\n")
    assert len(lines) >= 2, out
    for line in lines:
        doc = json.loads(line)
        VALIDATOR.validate(doc)
        assert doc["run_id"] == run and len(doc["nodes"]) == 2


def test_watch_on_a_terminal_redraws_in_place(job):
    port, run, _ = job
    master, slave = pty.openpty()
    try:
        p = popen_retry([DDPRUN, "status", f"--rdzv-endpoint=127.0.0.1:{port}", "--watch",
                         "--interval=0.2"], stdout=slave, stderr=subprocess.PIPE,
                        stdin=subprocess.DEVNULL)
        os.close(slave)
        slave = None
        seen = b""
        deadline = time.monotonic() + 30
        while seen.count(b"\x1b[H\x1b[2J") < 3 and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                seen += os.read(master, 65536)
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            pytest.fail("ddprun status --watch on a terminal ignored SIGINT")
        assert p.returncode == 0, p.stderr.read()
    finally:
        os.close(master)
        if slave is not None:
            os.close(slave)
    frames = seen.decode().replace("\r\n", "\n").split("\x1b[H\x1b[2J")
    assert len(frames) >= 4 and frames[0] == "", seen  # each frame clears the screen first
    for f in frames[1:3]:
        header, rows = table_rows(f)
        assert header.startswith(f"run {run}  state running") and len(rows) == 4, f


# ------------------------------------------------------------------ (b) a real 2-agent job

def live_workers(agent_pids):
    """The truth from /proc: {pid: (RANK, LOCAL_RANK, GROUP_RANK)} of every running ddp-train
    process whose parent is one of the agents."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if fields[0] in ("Z", "X") or int(fields[1]) not in agent_pids:
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if b"ddp-train" not in f.read():
                    continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            out[int(d)] = tuple(int(env[k]) for k in (b"RANK", b"LOCAL_RANK", b"GROUP_RANK"))
        except (OSError, IndexError, KeyError, ValueError):
            continue  # gone meanwhile, or not a worker yet
    return out


def view(doc):
    """What the status says: {pid: (rank, local_rank, group_rank)} of its running ranks."""
    return {r["pid"]: (r["rank"], r["local_rank"], n["group_rank"])
            for n in doc["nodes"] for r in n["ranks"] if r["state"] == "running"}


class Looker:
    """Looks at the job (--json, validated each time) until it matches the truth."""

    def __init__(self, port, run, agents):
        self.port, self.run, self.agents = port, run, agents
        self.looks, self.last, self.truth = 0, None, None

    def look(self):
        """The job, or None before its first record (exit 1, the documented message)."""
        p = status(f"--rdzv-endpoint=127.0.0.1:{self.port}", f"--run-id={self.run}", "--json")
        self.truth = live_workers({a.pid for a in self.agents})
        if p.returncode == 1 and self.looks == 0 and \
                f"no ddprun job with run id '{self.run}'" in p.stderr:
            return None
        assert p.returncode == 0, p.stderr
        self.last = json.loads(p.stdout)
        VALIDATOR.validate(self.last)
        self.looks += 1
        return self.last

    def settled(self, restarts):
        """2 nodes, 4 running ranks whose pids, ranks and node ranks are the live workers', all
        past their first step, `restarts` restarts."""
        doc = self.look()
        return doc is not None and (doc["state"] == "running" and doc["members"] == 2 and doc["ranks"] == 4 and
                doc["restarts"] == restarts and len(doc["nodes"]) == 2 and
                all(r["step"] >= 0 for n in doc["nodes"] for r in n["ranks"]) and
                len(self.truth) == 4 and view(doc) == self.truth)

    def why(self, agents):
        return (f"after {self.looks} looks, status:\n{json.dumps(self.last, indent=1)}\n"
                f"live workers: {self.truth}\n" + "\n".join(a.output() for a in agents))


@needs_ddp_train
def test_real_job_as_it_runs_and_restarts(launcher, tmp_path):  # noqa: F811 (fixture)
    d = Daemon()
    launcher.daemons.append(d)
    run = "real-" + uuid.uuid4().hex[:8]
    common = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
              f"--rdzv-endpoint=127.0.0.1:{d.port}", f"--rdzv-id={run}", "--max-restarts=1",
              "--status-interval=0.2", "--no-python", TRAIN, "--dataset", "synthetic",
              "--threads", "1", "--snapshot", "", "--no-eval", "--log-every", "1000",
              "--recovery", "restart", "100000", "0"]  # runs until the test stops it
    env = {"OMP_NUM_THREADS": "1"}
    agents = [launcher.start(*common, name="nodeA", env=env),
              launcher.start(*common, name="nodeB", env=env)]
    looker = Looker(d.port, run, agents)
    assert wait_for(lambda: looker.settled(0), 120, 0.2), looker.why(agents)
    first = looker.last
    launcher.worker_pids += [(pid, "ddp-train") for pid in looker.truth]
    assert sorted(n["slot"] for n in first["nodes"]) == [0, 1]
    assert {n["agent_pid"] for n in first["nodes"]} == {a.pid for a in agents}
    assert sorted(r for r, _, _ in looker.truth.values()) == [0, 1, 2, 3]

    # The table says the same, and --watch keeps saying it until SIGINT.
    p = status(f"--rdzv-endpoint=127.0.0.1:{d.port}", f"--run-id={run}")
    assert p.returncode == 0, p.stderr
    header, rows = table_rows(p.stdout)
    assert header.startswith(f"run {run}  state running  round "), p.stdout
    assert "nodes 2  ranks 4  restarts 0/1" in header, p.stdout
    assert sorted(r["RANK"] for r in rows) == ["0", "1", "2", "3"], p.stdout
    assert {r["STATE"] for r in rows} == {"running"}, p.stdout
    w, text = watch(d.port, tmp_path, f"--run-id={run}")
    ok = wait_for(lambda: text().count(f"run {run}  ") >= 2 or w.poll() is not None, 30)
    out = stop_watch(w, signal.SIGINT, text)
    assert ok, out
    assert all(len(table_rows(t + "\n")[1]) == 4 for t in out.rstrip("\n").split("\n\n")), out

    # Kill global rank 3: its node restarts the job once (--max-restarts=1).
    victim = next(pid for pid, (rank, _, _) in looker.truth.items() if rank == 3)
    victim_local = looker.truth[victim][1]
    with open(f"/proc/{victim}/stat") as f:
        victim_agent = int(f.read().rsplit(")", 1)[1].split()[1])
    old = set(looker.truth)
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: looker.settled(1) and not old & set(looker.truth), 120, 0.2), \
        looker.why(agents)
    launcher.worker_pids += [(pid, "ddp-train") for pid in looker.truth]
    after = looker.last
    assert after["round"] > first["round"], after
    assert max(n["restart_count"] for n in after["nodes"]) == 1, after
    events = [e for n in after["nodes"] for e in n["restarts"]]
    assert events and any(e["cause"] == "signal" for e in events), events
    assert sum(n["failures_by_cause"].get("signal", 0) for n in after["nodes"]) >= 1, after
    node = next(n for n in after["nodes"] if n["agent_pid"] == victim_agent)
    killed = next(r for r in node["ranks"] if r["local_rank"] == victim_local)
    assert killed["last_exit"] == -9 and "SIGKILL" in killed["last_error"], node
    assert killed["restarts"] == 1 and node["restart_count"] == 1, node
    assert looker.looks >= 3

    for a in agents:
        a.proc.send_signal(signal.SIGTERM)
    for a in agents:
        a.wait(60)


# ------------------------------------------------------- (c) a --standalone job can be found

def test_a_standalone_job_prints_where_ddprun_status_finds_it(tmp_path):
    # A --standalone job's store port is chosen at start: ddprun prints it, with the command.
    p = popen_retry([DDPRUN, "--standalone", "--nproc-per-node=1", "--no-python", "/bin/sleep",
                     "30"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    stdin=subprocess.DEVNULL, text=True, cwd=tmp_path)
    try:
        line, deadline = "", time.monotonic() + 30
        while "rendezvous store on" not in line and time.monotonic() < deadline:
            line = p.stderr.readline()
        assert "rendezvous store on" in line, line
        hint = line.split("follow the job with: ", 1)[1].split()
        assert hint[:3] == ["ddprun", "status", "--rdzv-endpoint"], line
        endpoint, run_id = hint[3], hint[5]
        assert line.startswith(f"ddprun: rendezvous store on {endpoint} (run id {run_id})"), line
        doc = None
        for _ in range(50):  # the agent's first record follows its round
            q = status(f"--rdzv-endpoint={endpoint}", f"--run-id={run_id}", "--json")
            if q.returncode == 0:
                doc = json.loads(q.stdout)
                break
            time.sleep(0.2)
        assert doc is not None, q.stderr
        assert doc["run_id"] == run_id, doc
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
