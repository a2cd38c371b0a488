"""The /metrics endpoints with the real Prometheus tools (issue 18, docs/metrics.md): while a
2-agent job runs against ddprund on 127.0.0.1, `promtool check metrics` accepts ddprund's and
both agents' expositions with no lint problem; then a real Prometheus server, started here in a
private directory, scrapes all three every second, a worker is killed, and Prometheus answers
max(ddprun_job_restarts_total) == 1 once the job has restarted."""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid

import pytest

from support.pytest_tools import needs_tool

from conftest import Daemon, popen_retry
from ddprun_multinode_helpers import gone, launcher, wait_for  # noqa: F401

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
needs_promtool = needs_tool(os.path.exists(PROMTOOL), "promtool (Debian's prometheus)")
needs_prometheus = needs_tool(os.path.exists(PROMETHEUS), "prometheus (Debian's prometheus)")

LIVE_VIEW = re.compile(r"ddprun: live view at http://([^/:\s]+|\[[^\]]+\]):(\d+)/")

# A worker that reports a step every 0.2 s on the progress channel, for at most 2 minutes (bash:
# the channel's descriptor may have two digits, which dash cannot redirect to).
BASH = ("--no-python", "/bin/bash", "-c")
WORKER = """M={marker}; i=0
while [ $i -lt 600 ]; do
  i=$((i+1))
  if [ -n "$DDPRUN_PROGRESS_FD" ]; then echo "step=$i" >&"$DDPRUN_PROGRESS_FD"; fi
  sleep 0.2
done"""

# Never through a proxy: every address here is 127.0.0.1.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(port, path, timeout=5):
    with OPENER.open(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def try_get(port, path):
    try:
        return http_get(port, path)
    except OSError:
        return None


def promtool_check(text):
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    return p.returncode, (p.stdout + p.stderr).strip()


def series(text, name):
    """The sample lines of family `name` (exactly that name)."""
    return [line for line in text.splitlines()
            if line.startswith(name + "{") or line.startswith(name + " ")]


def all_ranks(job):
    return [r for n in job.get("nodes", []) for r in n.get("ranks", [])]


class Prometheus:
    """A Prometheus server in its own process group, its data and config under `workdir`."""

    def __init__(self, workdir, targets, credentials=None, tls_ca=None):
        """credentials: {job: a file holding the bearer token its targets ask for}; tls_ca:
        {job: the CA file of its targets' HTTPS certificates} (scheme https)."""
        self.dir = os.path.join(workdir, "prometheus")
        os.makedirs(self.dir)
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
                    "  evaluation_interval: 1s\nscrape_configs:\n")
            for job, ports in targets.items():
                hosts = ", ".join(f"'127.0.0.1:{p}'" for p in ports)
                f.write(f"  - job_name: {job}\n")
                if tls_ca and job in tls_ca:
                    f.write(f"    scheme: https\n    tls_config:\n      ca_file: {tls_ca[job]}\n")
                if credentials and job in credentials:
                    f.write(f"    authorization:\n      type: Bearer\n"
                            f"      credentials_file: {credentials[job]}\n")
                f.write(f"    static_configs:\n      - targets: [{hosts}]\n")
        self.log_path = os.path.join(self.dir, "log")
        self.port = None
        for _ in range(3):  # the free port may be taken between choosing and binding
            self.port = _free_port()
            with open(self.log_path, "w") as log:
                self.proc = popen_retry(
                    [PROMETHEUS, f"--config.file={config}",
                     f"--storage.tsdb.path={os.path.join(self.dir, 'data')}",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True)
            ready = wait_for(lambda: self.proc.poll() is not None or
                             (try_get(self.port, "/-/ready") or (0,))[0] == 200, 60, 0.2)
            if ready and self.proc.poll() is None:
                return
            self.stop()
        pytest.fail("prometheus did not become ready:\n" + self.output())

    def output(self):
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def query(self, q):
        """The instant vector of `q` as {frozen labels: float}; None when unreachable."""
        got = try_get(self.port, "/api/v1/query?" + urllib.parse.urlencode({"query": q}))
        if got is None or got[0] != 200:
            return None
        body = json.loads(got[2])
        assert body["status"] == "success", body
        return {tuple(sorted(r["metric"].items())): float(r["value"][1])
                for r in body["data"]["result"]}

    def value(self, q):
        """The single value of `q`, or None when it has no sample (yet)."""
        res = self.query(q)
        if not res:
            return None
        assert len(res) == 1, (q, res)
        return next(iter(res.values()))

    def wait_value(self, q, want, timeout=60, context=lambda: ""):
        last = [None]

        def check():
            last[0] = self.value(q)
            return last[0] == want
        assert wait_for(check, timeout, 0.5), \
            f"Prometheus: {q} is {last[0]} after {timeout} s, want {want}\n" \
            f"--- prometheus:\n{self.output()}\n{context()}"

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Job:
    """ddprund (HTTP on an OS-chosen port) and two agents with --http-port 0, 2 ranks each,
    --max-restarts=1, running WORKER."""

    def __init__(self, launcher, tmp_path):  # noqa: F811
        self.launcher = launcher
        self.run_id = "metrics-" + uuid.uuid4().hex[:8]
        port_file = str(tmp_path / "ddprund-http-port")
        self.daemon = Daemon("--http-port", "0", "--http-port-file", port_file)
        launcher.daemons.append(self.daemon)
        assert wait_for(lambda: os.path.exists(port_file), 15), self.daemon.output()
        self.http_port = int(open(port_file).read())
        common = ["--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{self.daemon.port}", f"--rdzv-id={self.run_id}",
                  "--rdzv-conf=join_timeout=60", "--max-restarts=1", "--monitor-interval=0.1",
                  "--status-interval=0.5", "--http-port=0", "--http-host=127.0.0.1",
                  "--progress=off"]
        script = WORKER.format(marker=self.run_id)
        self.agents = [launcher.start(*common, *BASH, script, name=f"node{i}") for i in range(2)]
        self.agent_ports = [self._live_view_port(a) for a in self.agents]

    def _live_view_port(self, agent):
        found = []

        def seen():
            m = LIVE_VIEW.search(agent.stderr)
            if m:
                found.append(int(m.group(2)))
            return bool(m) or agent.proc.poll() is not None
        assert wait_for(seen, 60, 0.1) and found, \
            "no 'ddprun: live view at http://HOST:PORT/' line:\n" + agent.output()
        return found[0]

    def output(self):
        return "\n".join(a.output() for a in self.agents) + "\n--- ddprund:\n" + \
            self.daemon.output()

    def status(self):
        got = try_get(self.http_port, "/api/status?" + urllib.parse.urlencode({"run": self.run_id}))
        if got is None or got[0] != 200:
            return {}
        job = json.loads(got[2])
        for r in all_ranks(job):  # for the teardown: kill what the agents leave behind
            pid = r.get("pid", 0)
            if pid > 0 and (pid, self.run_id) not in self.launcher.worker_pids:
                self.launcher.worker_pids.append((pid, self.run_id))
        return job

    def wait_running(self, timeout=90):
        last = [{}]

        def ready():
            last[0] = self.status()
            ranks = all_ranks(last[0])
            return len(ranks) == 4 and all(r["state"] == "running" and r["pid"] > 0
                                           for r in ranks)
        assert wait_for(ready, timeout, 0.2), \
            f"4 running ranks not seen:\n{json.dumps(last[0], indent=1)}\n{self.output()}"
        return last[0]

    def metrics(self, port):
        status, ctype, text = http_get(port, "/metrics")
        assert status == 200 and ctype.startswith("text/plain"), (status, ctype)
        return text

    def stop(self):
        """SIGTERM (the agents stop their workers), then the fixture kills what is left."""
        for a in self.agents:
            if a.proc.poll() is None:
                a.proc.send_signal(signal.SIGTERM)
        for a in self.agents:
            try:
                a.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def job(launcher, tmp_path):  # noqa: F811
    j = Job(launcher, tmp_path)
    try:
        yield j
    finally:
        j.stop()


@needs_promtool
def test_promtool_accepts_ddprund_and_agent_metrics(job):
    job.wait_running()
    # The ranks' progress reaches the records within a few intervals.
    assert wait_for(lambda: len(series(job.metrics(job.http_port), "ddprun_rank_step")) == 4,
                    30, 0.5), job.metrics(job.http_port)
    texts = {"ddprund": job.metrics(job.http_port)}
    for i, port in enumerate(job.agent_ports):
        texts[f"node{i}"] = job.metrics(port)
    for name, text in texts.items():
        rc, out = promtool_check(text)
        assert rc == 0 and out == "", f"promtool check metrics on {name}: rc {rc}\n{out}\n{text}"

    d = texts["ddprund"]
    run = f'run_id="{job.run_id}"'
    assert len([s for s in series(d, "ddprun_rank_state") if run in s]) == 4, d
    assert f'ddprun_job_ranks{{{run}}} 4' in d, d
    assert f'ddprun_job_members{{{run}}} 2' in d, d
    assert f'ddprun_job_restarts_total{{{run}}} 0' in d, d
    assert len([s for s in series(d, "ddprun_node_up") if run in s and s.endswith(" 1")]) == 2
    # The store counters of the store ddprund serves, in real use.
    sets = [s for s in series(d, "ddprun_store_requests_total") if 'op="set"' in s]
    assert len(sets) == 1 and int(sets[0].split()[-1]) > 0, d
    for name in ("ddprun_store_received_bytes_total", "ddprun_store_sent_bytes_total",
                 "ddprun_store_keys", "ddprun_store_connections"):
        got = series(d, name)
        assert len(got) == 1 and float(got[0].split()[-1]) > 0, (name, got)
    # Each agent shows its own node: two ranks, and no store (ddprund serves it).
    for i in range(2):
        a = texts[f"node{i}"]
        assert len(series(a, "ddprun_rank_state")) == 2, a
        assert not series(a, "ddprun_store_requests_total"), a


@needs_promtool
@needs_prometheus
def test_prometheus_scrapes_and_sees_the_restart(job, tmp_path):
    before = job.wait_running()
    prom = Prometheus(str(tmp_path), {"ddprund": [job.http_port], "ddprun": job.agent_ports})

    def wait(q, want):
        prom.wait_value(q, want, 60, job.output)
    try:
        # Every target scraped without error, and the job seen whole before the fault.
        wait("count(up == 1)", 3)
        wait(f'count(ddprun_rank_state{{job="ddprund",run_id="{job.run_id}",'
             f'state="running"}})', 4)
        wait("max(ddprun_job_restarts_total)", 0)

        victim = next(r for n in before["nodes"] for r in n["ranks"] if r["local_rank"] == 1)
        os.kill(victim["pid"], signal.SIGKILL)

        wait("max(ddprun_job_restarts_total)", 1)
        wait("min(ddprun_job_restarts_total)", 1)  # ddprund and both agents
        wait(f'sum(ddprun_failures_total{{job="ddprund",run_id="{job.run_id}"}})', 1)
        wait(f'count(ddprun_rank_state{{job="ddprund",run_id="{job.run_id}",'
             f'state="running"}})', 4)
        assert gone(victim["pid"])
        targets = json.loads(http_get(prom.port, "/api/v1/targets")[2])["data"]["activeTargets"]
        assert len(targets) == 3 and all(t["health"] == "up" and t["lastError"] == ""
                                         for t in targets), targets
        # After a failure the expositions (exit codes, failure causes) still lint clean.
        for port in [job.http_port, *job.agent_ports]:
            rc, out = promtool_check(job.metrics(port))
            assert rc == 0 and out == "", out
    finally:
        prom.stop()
