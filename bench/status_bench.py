"""The live status (issue 18), measured side by side in one run (results in docs/perf.md):
  a. overhead at steady state on a 2 x 2 job: ddprund + 2 ddprun agents on 127.0.0.1 running
     ddp-train (CPU) for a fixed number of steps, with the live status fully on (agents
     --status-interval 1 --http-port 0, ddprund --http-port 0, a poller GETting /api/status
     and /metrics of all three every second) and off (--status-interval 0 --progress=off, no
     agent HTTP, ddprund --http-port -1), A/B interleaved. Reports ddp-train's median step time
     (from its own progress lines, startup left out) of each mode and the ratio on/off (target:
     under 1.01), each agent's VmRSS at the second and the last progress line (target: growth
     < 5 MiB), and the CPU time of the agents and ddprund over that window (a tighter bound on
     the cost than step times, which vary by a few % from run to run on a small machine).
  b. a 1024-node simulated job: 1024 node records of 4 ranks (the fields an agent publishes,
     job_view.hpp's keys) written into ddprund under one run id; GET /api/status and GET
     /metrics timed (median, p95) and `ddprun status --json` wall time, first with the records
     at rest, then live: 1024 store connections (simulated agents, spread over a few
     processes) each re-publishing its record every second, as agents do. Anchor: the 100 ms
     target for /api/status.
Usage: scripts/loopback_only.sh python3 bench/status_bench.py \\
         [--bin build/bin] [--reps 3] [--steps 6000] [--nodes 1024] [--requests 50] \\
         [--out bench/results/status_bench.json] [--only a|b]
(any python3 >= 3.8; the simulated agents speak the store's wire protocol themselves.)"""
import argparse
import http.client
import json
import os
import re
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FMNIST = "/usr/share/datasets/fashion-mnist"
GIB = 1 << 30
KEYS = "/ddprun/status/"  # job_view.hpp's root (with torch's "/", so torch clients reach it)


def env_clean(**kw):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith(("PET_", "TORCHELASTIC_", "DDPRUN_"))}
    for k in ("OMP_NUM_THREADS", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(k, None)
    e.update({k: str(v) for k, v in kw.items()})
    return e


def wait_file(path, bound, proc=None):
    deadline = time.time() + bound
    while time.time() < deadline:
        if os.path.exists(path) and open(path).read().strip():
            return open(path).read().strip()
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.02)
    raise SystemExit(f"status_bench: {path} did not appear within {bound} s")


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


class Ddprund:
    """ddprund on 127.0.0.1:0; http=False passes --http-port -1."""

    def __init__(self, bin_dir, work, http=True):
        self.port_file = os.path.join(work, f"ddprund-{time.time_ns()}.port")
        self.http_file = self.port_file + ".http"
        argv = [os.path.join(bin_dir, "ddprund"), "--host", "127.0.0.1", "--port", "0",
                "--port-file", self.port_file]
        argv += ["--http-port", "0", "--http-port-file", self.http_file] if http else \
            ["--http-port", "-1"]
        self.log = open(self.port_file + ".log", "w+")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env_clean())
        self.port = int(wait_file(self.port_file, 20, self.proc))
        self.http_port = int(wait_file(self.http_file, 20, self.proc)) if http else None

    def stop(self):
        kill_group(self.proc)


def http_get(port, path, timeout=30):
    """(seconds, status, body) of one GET on a fresh connection, as a scraper makes it."""
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("GET", path)
    r = c.getresponse()
    body = r.read()
    c.close()
    return time.perf_counter() - t0, r.status, body


def pct(xs, p):
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def timing(xs):
    return {"median_ms": round(1000 * statistics.median(xs), 2),
            "p95_ms": round(1000 * pct(xs, 95), 2), "n": len(xs)}


# ------------------------------------------------------------------ (b) the 1024-node job

METRICS = True  # --no-metrics: records as agents before issue 36 wrote them


def node_record(run_id, slot, nodes, seq, now, metrics=None, interval=1.0):
    """One agent's record as record.cpp's to_json writes it: 4 ranks on 4 GPUs, running; with
    metrics (issue 36), each rank's loss, lr and tokens/s (the node's history of them has a
    key of its own: history_json)."""
    metrics = METRICS if metrics is None else metrics
    ranks = []
    for lr in range(4):
        ranks.append({
            "local_rank": lr, "rank": slot * 4 + lr, "pid": 100000 + slot * 8 + lr,
            "state": "running", "restarts": 1 if slot % 97 == 0 else 0,
            "last_exit": -9 if slot % 97 == 0 else None,
            "last_error": "signal 9 (SIGKILL)" if slot % 97 == 0 else "",
            "step": 1200 + seq, "step_time_s": 0.1234 + 0.0001 * (slot % 7),
            "samples_per_s": 518.7, "total_steps": 100000, "cpu": 0.98,
            "rss_bytes": 2_345_678_848 + lr * 4096, "gpu": lr, "gpu_util": 0.93,
            "gpu_mem_used": 61 * GIB + lr * 1_048_576, "gpu_mem_total": 80 * GIB})
        if metrics:
            ranks[-1].update({"metrics": {"loss": 2.3456789 - 0.0001 * seq, "lr": 0.0003,
                                          "tokens_per_s": 52345.678}, "bad_metrics": 0})
    t0 = now - 3600
    return json.dumps({
        "schema": 1, "run_id": run_id, "job_id": "4242", "host": f"gpu-node-{slot:04d}",
        "slot": slot, "agent_pid": 50000 + slot, "state": "running", "round": 1,
        "group_rank": slot, "group_world_size": nodes, "world_size": nodes * 4,
        "restart_count": 1, "max_restarts": 3, "started": t0, "updated": now,
        "interval_s": interval, "seq": seq, "lost": False, "ranks": ranks,
        "restarts": [{"round": 1, "at": t0 + 600, "cause": "node_lost",
                      "what": "node gpu-node-0097 stopped renewing its lease"}],
        "failures_by_cause": {"node_lost": 1},
        "phases": [{"name": "rendezvous", "start": t0, "end": t0 + 4.2, "detail": "round 0"},
                   {"name": "run", "start": t0 + 6.0, "end": t0 + 600, "detail": "round 0"},
                   {"name": "restart", "start": t0 + 600, "end": t0 + 604, "detail": "node_lost"},
                   {"name": "run", "start": t0 + 604, "end": 0, "detail": "round 1"}]},
        separators=(",", ":"))


_HISTORY = {}


def history_json(t0):
    """A node's history at its bound (4 metrics x 64 points), as an agent SETs it under
    <run>/history/<slot> every 5th publication; made once (the publishers send a thousand
    records a second from Python)."""
    if not _HISTORY:
        _HISTORY["json"] = json.dumps(
            {k: [[s * 50, round(t0 + s * 56.25, 3), round(2.5 - s * 0.0123, 6)] for s in range(64)]
             for k in ("loss", "lr", "tokens_per_s", "samples_per_s")}, separators=(",", ":"))
    return _HISTORY["json"]


class RawStore:
    """A minimal torch 2.x TCPStore client (docs/wire_protocol.md), light enough for 1024 of
    them in a few processes. SET and APPEND get no reply; ADD answers with the new value, so
    it also marks the end of what was pipelined before it."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.s.sendall(b"\x00" + struct.pack("<I", 0x3C85F7CE))  # VALIDATE

    @staticmethod
    def _str(b):
        return struct.pack("<Q", len(b)) + b

    def set(self, key, value):
        self.s.sendall(b"\x01" + self._str(key.encode()) + self._str(value.encode()))

    def append(self, key, value):
        self.s.sendall(b"\x09" + self._str(key.encode()) + self._str(value.encode()))

    def add(self, key, n):
        self.s.sendall(b"\x04" + self._str(key.encode()) + struct.pack("<q", n))
        got = b""
        while len(got) < 8:
            chunk = self.s.recv(8 - len(got))
            if not chunk:
                raise SystemExit("status_bench: the store closed the connection")
            got += chunk
        return struct.unpack("<q", got)[0]


def publisher_main(port, run_id, first, count, nodes):
    """A process holding `count` simulated agents (one store connection each); each SETs its
    record once a second, spread over the second, until stdin closes. Prints its SET count."""
    clients = [RawStore(port) for _ in range(count)]
    print("ready", flush=True)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    sets, seq, start = 0, 0, time.time()
    while not done.is_set():
        tick = time.time()
        seq += 1
        for i, c in enumerate(clients):
            slot = first + i
            if METRICS and seq % 5 == 0:  # as an agent: its history every 5th publication
                c.set(f"{KEYS}{run_id}/history/{slot}", history_json(time.time() - 3600))
            c.set(f"{KEYS}{run_id}/node/{slot}",
                  node_record(run_id, slot, nodes, seq, time.time()))
            sets += 1
            lag = tick + (i + 1) / count - time.time()
            if lag > 0:
                time.sleep(lag)
    print(json.dumps({"sets": sets, "seconds": round(time.time() - start, 2)}), flush=True)


def measure_views(bin_dir, d, run_id, nodes, requests, cli_runs):
    out = {}
    for path in ("/api/status", f"/api/status?run={run_id}", "/metrics",
                 f"/api/history?run={run_id}", f"/api/history?run={run_id}&format=csv"):
        times = []
        for i in range(requests):
            dt, code, body = http_get(d.http_port, path)
            if code != 200:
                raise SystemExit(f"status_bench: GET {path} answered {code}: {body[:300]!r}")
            if i == 0 and path.startswith("/api/status") and "history" not in path:
                job = json.loads(body)
                if len(job["nodes"]) != nodes or job["ranks"] != 4 * nodes:
                    raise SystemExit(f"status_bench: {path} shows {len(job['nodes'])} nodes, "
                                     f"{job['ranks']} ranks; wanted {nodes}, {4 * nodes}")
            times.append(dt)
        out[path] = {**timing(times), "bytes": len(body)}
    times = []
    for _ in range(cli_runs):
        t0 = time.perf_counter()
        p = subprocess.run([os.path.join(bin_dir, "ddprun"), "status", "--rdzv-endpoint",
                            f"127.0.0.1:{d.port}", "--run-id", run_id, "--json"],
                           capture_output=True, text=True, env=env_clean(), timeout=60)
        times.append(time.perf_counter() - t0)
        if p.returncode != 0 or len(json.loads(p.stdout)["nodes"]) != nodes:
            raise SystemExit(f"status_bench: ddprun status --json failed:\n{p.stderr[-2000:]}")
    out["ddprun status --json"] = timing(times)
    return out


def simulated_job(bin_dir, work, nodes, requests, procs=4):
    d = Ddprund(bin_dir, work)
    run_id = "sim1024"
    try:
        w = RawStore(d.port)
        now = time.time()
        for slot in range(nodes):
            # At rest nobody re-publishes: an interval of an hour keeps the nodes from being
            # marked lost while the requests take their time.
            if METRICS:
                w.set(f"{KEYS}{run_id}/history/{slot}", history_json(now - 3600))
            w.set(f"{KEYS}{run_id}/node/{slot}",
                  node_record(run_id, slot, nodes, 1, now, interval=3600.0))
        w.add(f"{KEYS}{run_id}/slots", nodes)
        w.set(f"{KEYS}{run_id}/index", "".join(f"{s}," for s in range(nodes)))
        w.append(KEYS + "runs", run_id + "\n")
        w.add(f"{KEYS}{run_id}/slots", 0)  # a reply: everything before it landed
        res = {"nodes": nodes, "ranks": 4 * nodes,
               "record_bytes": len(node_record(run_id, 0, nodes, 1, now)),
               "history_bytes": len(history_json(now - 3600)),
               "record_bytes_without_metrics": len(node_record(run_id, 0, nodes, 1, now, False))}
        res["at_rest"] = measure_views(bin_dir, d, run_id, nodes, requests, 10)
        # Live: every simulated agent re-publishes its record each second while we measure.
        per = (nodes + procs - 1) // procs
        pubs = []
        for k in range(procs):
            first, count = k * per, min(per, nodes - k * per)
            pubs.append(subprocess.Popen(
                [sys.executable, __file__, "--publisher", str(d.port), run_id, str(first),
                 str(count), str(nodes), "1" if METRICS else "0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, start_new_session=True, env=env_clean()))
        for p in pubs:
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("status_bench: a publisher did not start")
        time.sleep(2)  # one full round of SETs before the first look
        live = measure_views(bin_dir, d, run_id, nodes, requests, 10)
        sets = secs = 0
        for p in pubs:
            p.stdin.close()
            r = json.loads(p.stdout.read().strip().splitlines()[-1])
            sets, secs = sets + r["sets"], max(secs, r["seconds"])
            p.wait(timeout=30)
        live["publish_sets_per_s"] = round(sets / secs, 1)
        res["live"] = live
        return res
    finally:
        d.stop()


# ------------------------------------------------------------------- (a) the 2 x 2 overhead

BATCH = 64  # per rank
LINE = re.compile(r"epoch (\d+)/\d+ step (\d+)/(\d+) loss \S+ samples/s (\d+)")


class Agent:
    """One ddprun agent (a node) of the 2 x 2 job; its output read by threads."""

    def __init__(self, bin_dir, store_port, run_id, on, train_args):
        flags = ["--status-interval", "1", "--http-port", "0"] if on else \
            ["--status-interval", "0", "--progress=off"]
        argv = [os.path.join(bin_dir, "ddprun"), "--nnodes=2", "--nproc-per-node=2",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{store_port}",
                f"--rdzv-id={run_id}", *flags, "--no-python",
                os.path.join(bin_dir, "ddp-train"), *train_args]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True, env=env_clean())
        self.http_port = None
        self.progress, self.lines = [], []  # (arrival, global step, seconds since its start)
        self.threads = [threading.Thread(target=self._read, args=(s,), daemon=True)
                        for s in (self.proc.stdout, self.proc.stderr)]
        for t in self.threads:
            t.start()

    def _read(self, stream):
        for line in stream:
            self.lines.append(line)
            m = re.search(r"live view at http://[^ ]*:(\d+)/", line)
            if m:
                self.http_port = int(m.group(1))
            m = LINE.search(line)
            if m:  # ddp-train's rank 0: its rate is over all samples since it started training
                epoch, mb, nb, rate = (int(g) for g in m.groups())
                step = (epoch - 1) * nb + mb
                seconds = step * BATCH * 4 / rate if rate else 0.0  # 4 ranks, full batches
                self.progress.append((time.time(), step, seconds))

    def wait(self, bound):
        try:
            self.proc.wait(timeout=bound)
        finally:
            kill_group(self.proc)
            for t in self.threads:
                t.join(timeout=5)


def vm_rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cpu_seconds(pid):
    """utime + stime of `pid` (all its threads; not its children), from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def sample_procs(procs, stop, out):
    """Each process's VmRSS and CPU time twice a second: out[i] = [(time, bytes, cpu s)]."""
    while True:
        now = time.time()
        for i, p in enumerate(procs):
            rss, cpu = vm_rss(p.pid), cpu_seconds(p.pid)
            if p.poll() is None and rss is not None and cpu is not None:
                out[i].append((now, rss, cpu))
        if stop.wait(0.5):
            return


def poll_views(ports, stop, counts, failures):
    """GETs /api/status and /metrics of every HTTP port once a second until `stop`."""
    while not stop.wait(1.0):
        for port in [p for p in ports() if p]:
            for path in ("/api/status", "/metrics"):
                try:
                    _, code, body = http_get(port, path, timeout=5)
                    error = None if code == 200 else f"HTTP {code}"
                    if code == 200 and path == "/api/status":
                        job = json.loads(body)
                        counts["ranks"] = max(counts["ranks"], job.get("ranks", 0))
                except OSError as e:
                    error = str(e)
                counts[error is None] += 1
                if error:
                    failures.append((time.time(), port, path, error))


def one_job(bin_dir, work, on, steps, rep):
    d = Ddprund(bin_dir, work, http=on)
    snap = os.path.join(work, f"snap-{rep}-{int(on)}.ddp")
    # 51200 samples: 200 full batches of 64 per rank and epoch, so samples = steps * 256.
    train_args = ["--data", FMNIST, "--train-subset", "51200", "--threads", "1",
                  "--batch-size", str(BATCH), "--max-steps", str(steps), "--log-every", "100",
                  "--no-eval", "--snapshot", snap, "100000", "0"]
    stop, counts, failures = threading.Event(), {True: 0, False: 0, "ranks": 0}, []
    agents, threads, samples = [], [], [[], [], []]  # agent 0, agent 1, ddprund
    try:
        agents = [Agent(bin_dir, d.port, f"ab{rep}{int(on)}", on, train_args) for _ in range(2)]
        threads.append(threading.Thread(target=sample_procs, args=(
            [a.proc for a in agents] + [d.proc], stop, samples)))
        if on:
            threads.append(threading.Thread(target=poll_views, args=(
                lambda: [d.http_port] + [a.http_port for a in agents], stop, counts, failures)))
        for t in threads:
            t.start()
        for a in agents:
            a.wait(900)
    finally:
        stop.set()
        for t in threads:
            t.join()
        for a in agents:
            kill_group(a.proc)
        d.stop()
    progress = sorted(p for a in agents for p in a.progress)
    if any(a.proc.returncode != 0 for a in agents) or len(progress) < 4:
        tail = "".join(agents[0].lines[-30:] + agents[1].lines[-30:]) if agents else ""
        raise SystemExit(f"status_bench: the 2 x 2 job failed (on={on}):\n{tail}")
    # Steady state: from the second progress line (warm-up left out) to the last.
    (t1, s1, at1), (t2, s2, at2) = progress[1], progress[-1]
    # Agents that finished training close their HTTP port: only failures before then count.
    failed = [f for f in failures if f[0] <= t2]
    if on and (failed or not counts[True] or not all(a.http_port for a in agents)):
        raise SystemExit(f"status_bench: the live views did not answer: {failed[:5]}")
    if on and counts["ranks"] != 4:
        raise SystemExit(f"status_bench: no view showed the job's 4 ranks ({counts})")
    rss, cpu = [], []  # per agent: (VmRSS at start, at end); per process: CPU ms per second
    for i, series in enumerate(samples):
        inside = [x for x in series if t1 <= x[0] <= t2]
        if len(inside) >= 2:
            (ta, ra, ca), (tb, rb, cb) = inside[0], inside[-1]
            cpu.append(1000.0 * (cb - ca) / (tb - ta))
            if i < 2:
                rss.append((ra, rb))
    if len(cpu) != 3 or len(rss) != 2:
        raise SystemExit("status_bench: too few /proc samples in the steady state")
    return {"step_ms": 1000.0 * (at2 - at1) / (s2 - s1), "steady_s": round(t2 - t1, 1),
            "polls": counts[True], "rss": rss, "agent_cpu_ms_per_s": cpu[:2],
            "ddprund_cpu_ms_per_s": cpu[2]}


def overhead(bin_dir, work, reps, steps):
    runs = {"off": [], "on": []}
    for rep in range(reps):
        for mode in (("off", "on") if rep % 2 == 0 else ("on", "off")):  # A/B, B/A, ...
            runs[mode].append(one_job(bin_dir, work, mode == "on", steps, rep))
            print(f"status_bench: 2x2 rep {rep} {mode}: {runs[mode][-1]}", file=sys.stderr)
    med = {m: statistics.median(r["step_ms"] for r in v) for m, v in runs.items()}
    out = {"steps": steps, "batch_per_rank": BATCH, "reps": reps}
    for m, v in runs.items():
        pairs = [p for r in v for p in r["rss"]]
        growth = [end - start for start, end in pairs]
        out[m] = {"median_step_ms": round(med[m], 4),
                  "step_ms_per_rep": [round(r["step_ms"], 4) for r in v],
                  "steady_s_per_rep": [r["steady_s"] for r in v],
                  "agent_rss_start_mib": round(statistics.median(s for s, _ in pairs) / 2**20, 2),
                  "agent_rss_growth_mib_max": round(max(growth) / 2**20, 3),
                  "agent_rss_growth_mib": [round(g / 2**20, 3) for g in growth],
                  "agent_cpu_ms_per_s": round(statistics.median(
                      c for r in v for c in r["agent_cpu_ms_per_s"]), 2),
                  "ddprund_cpu_ms_per_s": round(statistics.median(
                      r["ddprund_cpu_ms_per_s"] for r in v), 2),
                  "view_requests_answered": sum(r["polls"] for r in v)}
    out["step_time_ratio_on_to_off"] = round(med["on"] / med["off"], 4)
    # The status's own CPU (2 agents and ddprund; the poller, this process, left out) as a
    # share of the machine the 4 ranks train on: what it can take from their steps at most.
    extra = 2 * (out["on"]["agent_cpu_ms_per_s"] - out["off"]["agent_cpu_ms_per_s"]) + \
        out["on"]["ddprund_cpu_ms_per_s"] - out["off"]["ddprund_cpu_ms_per_s"]
    out["status_cpu_ms_per_s"] = round(extra, 2)
    out["status_cpu_share_of_machine"] = round(extra / (1000.0 * (os.cpu_count() or 1)), 5)
    return out


# ------------------------------------------------------------------------------ the report

def table(res):
    rows = []
    if "overhead" in res:
        o = res["overhead"]
        for m in ("off", "on"):
            rows.append((f"2x2 step time, status {m}", f"{o[m]['median_step_ms']:.3f} ms",
                         f"{o[m]['median_step_ms'] / o['off']['median_step_ms']:.4f} x off"))
            rows.append((f"2x2 agent RSS growth, status {m} (max)",
                         f"{o[m]['agent_rss_growth_mib_max']:.3f} MiB", "target < 5 MiB"))
            rows.append((f"2x2 CPU, status {m}: each agent / ddprund",
                         f"{o[m]['agent_cpu_ms_per_s']} / {o[m]['ddprund_cpu_ms_per_s']} ms/s", ""))
        rows.append(("2x2 status CPU (on - off, agents + ddprund)",
                     f"{o['status_cpu_ms_per_s']} ms/s",
                     f"{100 * o['status_cpu_share_of_machine']:.3f}% of the machine"))
    if "simulated" in res:
        s = res["simulated"]
        for phase in ("at_rest", "live"):
            for what, t in s[phase].items():
                if isinstance(t, dict):
                    size = f" ({t['bytes'] / 2**20:.1f} MiB)" if "bytes" in t else ""
                    rows.append((f"{s['nodes']} nodes {phase}: {what}{size}",
                                 f"{t['median_ms']} ms (p95 {t['p95_ms']})",
                                 f"{t['median_ms'] / 100:.3f} x 100 ms"))
        rows.append(("a node's record with / without metrics; its history",
                     f"{s['record_bytes']} / {s['record_bytes_without_metrics']}; "
                     f"{s['history_bytes']} B",
                     f"{s['record_bytes'] / s['record_bytes_without_metrics']:.2f} x"))
        rows.append((f"{s['nodes']} nodes live: records published",
                     f"{s['live']['publish_sets_per_s']}/s", f"wanted {s['nodes']}/s"))
    w = max(len(r[0]) for r in rows)
    return "\n".join(f"{a:<{w}}  {b:>24}  {c}" for a, b, c in rows)


def main():
    global METRICS
    if len(sys.argv) > 1 and sys.argv[1] == "--publisher":
        a = sys.argv[2:]
        METRICS = a[5] == "1"
        publisher_main(int(a[0]), a[1], int(a[2]), int(a[3]), int(a[4]))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--only", choices=("a", "b"))
    ap.add_argument("--no-metrics", action="store_true",
                    help="(b) records without metrics or histories, as before issue 36")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/status_bench.json"))
    a = ap.parse_args()
    METRICS = not a.no_metrics
    work = tempfile.mkdtemp(prefix="status-bench-")
    res = {"machine": f"{os.cpu_count()} cores", "started": time.strftime("%F %T")}
    if a.only != "a":
        res["simulated"] = simulated_job(a.bin, work, a.nodes, a.requests)
    if a.only != "b":
        res["overhead"] = overhead(a.bin, work, a.reps, a.steps)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res, indent=2))
    print()
    print(table(res))


if __name__ == "__main__":
    main()
