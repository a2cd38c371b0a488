"""Hang detection, measured side by side in one run (issue 17; results in docs/perf.md):
  1. time from an injected hang to ddprun's report, minus --hang-timeout: 2 agents x 2 workers,
     and 64 agents x 1 worker (simulated nodes, processes on loopback);
  2. overhead at steady state: ddp-train's samples/s with detection off, at its defaults
     (--hang-timeout=600: a check a second) and at --hang-timeout=2 (a check every 250 ms);
  3. the same fault (an unmodified gloo script whose rank 1 sleeps before all_reduce) under
     ddprun, torchrun 2.15 (with and without a 20 s process-group timeout) and, when it can be
     imported, nvidia-resiliency-ext's ft_launcher (with the heartbeat code it needs, and
     without): what each detects, whom it names, and when.
Usage: scripts/loopback_only.sh python3 bench/hang_bench.py [--bin build/bin] [--quick]
       (python3 = the torch venv's; NVRX_DIR = a folder with nvidia-resiliency-ext installed
       by `pip install --no-deps --target DIR nvidia-resiliency-ext defusedxml nvidia-ml-py
       psutil pynvml`, default ~/.cache/ddprun/nvrx)."""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
FMNIST = "/usr/share/datasets/fashion-mnist"
NEVER = 60.0  # seconds a launcher gets to report before "never (within 60 s)"

PROGRESS_WORKER = textwrap.dedent("""
    import os, sys, time
    fd = int(os.environ["DDPRUN_PROGRESS_FD"])
    rank = int(os.environ["RANK"])
    for step in range(10 ** 9):
        os.write(fd, f"step={step}\\n".encode())
        if rank == int(os.environ["STUCK_RANK"]) and step == 40:
            open(os.environ["HANG_AT"], "w").write(repr(time.time()))
            time.sleep(3600)
        time.sleep(0.05)
""")

GLOO = textwrap.dedent("""
    import os, sys, time, datetime
    import torch, torch.distributed as dist
    FT = os.environ.get("WITH_FT") == "1"
    def stuck_here():
        open(os.environ["HANG_AT"], "w").write(repr(time.time()))
        time.sleep(3600)
    kw = {}
    if os.environ.get("PG_TIMEOUT"):
        kw["timeout"] = datetime.timedelta(seconds=float(os.environ["PG_TIMEOUT"]))
    dist.init_process_group("gloo", **kw)
    if FT:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
        ft = RankMonitorClient()
        ft.init_workload_monitoring()
    t = torch.ones(4)
    for step in range(40):
        if FT:
            ft.send_heartbeat()
        if dist.get_rank() == 1 and step == 20:
            stuck_here()
        dist.all_reduce(t)
        time.sleep(0.05)
""")


def env_with(**kw):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "TORCHELASTIC_"))}
    e.pop("OMP_NUM_THREADS", None)
    # py-spy lives beside the venv's python
    e["PATH"] = os.path.dirname(sys.executable) + ":" + e.get("PATH", "/usr/bin:/bin")
    e.update({k: str(v) for k, v in kw.items()})
    return e


def watch(procs, pattern, bound):
    """Waits for `pattern` on any process's stderr (or for all to exit); returns the unix time
    of the first match (None), and everything they printed. Kills them after `bound` s."""
    found = [None]
    texts = [[] for _ in procs]

    def reader(i, p):
        for line in p.stderr:
            texts[i].append(line)
            if found[0] is None and re.search(pattern, line):
                found[0] = time.time()

    threads = [threading.Thread(target=reader, args=(i, p), daemon=True)
               for i, p in enumerate(procs)]
    for t in threads:
        t.start()
    deadline = time.time() + bound
    while time.time() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:  # each launcher leads a session of its own: end all of it, helpers too
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    for t in threads:
        t.join(timeout=5)
    return found[0], ["".join(t) for t in texts]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_to_report(bin_dir, nodes, nproc, timeout_s, work):
    """Agents x workers of PROGRESS_WORKER on loopback; one rank stops at step 40."""
    script = os.path.join(work, "progress_worker.py")
    open(script, "w").write(PROGRESS_WORKER)
    hang_at = os.path.join(work, f"hang_at_{nodes}")
    if os.path.exists(hang_at):
        os.unlink(hang_at)
    port = free_port()
    stuck = nodes * nproc - 2 if nodes * nproc > 2 else 1
    procs = []
    for n in range(nodes):
        argv = [os.path.join(bin_dir, "ddprun"), f"--nnodes={nodes}", f"--nproc-per-node={nproc}",
                "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                f"--rdzv-id=bench{nodes}", f"--hang-timeout={timeout_s}", "--on-hang=stop",
                "--log-dir=/dev/null", "--rdzv-conf=join_timeout=120", script]
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True, start_new_session=True, env=env_with(PYTHON_EXEC=sys.executable,
                                                              STUCK_RANK=stuck,
                                                              HANG_AT=hang_at)))
    when, texts = watch(procs, r"ddprun: hang: no progress", 180)
    if when is None or not os.path.exists(hang_at):
        return {"nodes": nodes, "nproc": nproc, "error": "no report", "tail": texts[0][-2000:]}
    start = float(open(hang_at).read())
    named = any(re.search(rf"Suspect[^\n]*\n\s+ranks {stuck}\b", t) for t in texts)
    return {"nodes": nodes, "nproc": nproc, "timeout_s": timeout_s,
            "report_after_s": round(when - start, 3),
            "beyond_timeout_s": round(when - start - timeout_s, 3), "named_right_rank": named}


def overhead(bin_dir, reps, steps, work):
    """ddp-train's own samples/s (its progress lines, so startup is left out), 2 ranks, with
    detection off, at its defaults and at --hang-timeout=2; modes interleaved per rep."""
    train = os.path.join(bin_dir, "ddp-train")
    snap = os.path.join(work, "overhead.ddp")
    args = ["--data", FMNIST, "--train-subset", "2048", "--threads", "1", "--batch-size", "64",
            "--max-steps", str(steps), "--no-eval", "--snapshot", snap, "200", "0"]
    modes = {"off": ["--hang-timeout=0", "--straggler-factor=0"], "defaults": [],
             "hang-timeout=2": ["--hang-timeout=2"]}
    rates = {m: [] for m in modes}
    for _ in range(reps):
        for m, flags in modes.items():  # interleaved: drift hits every mode alike
            if os.path.exists(snap):
                os.unlink(snap)  # each run starts fresh, not from the last one's snapshot
            p = subprocess.run([os.path.join(bin_dir, "ddprun"), "--standalone",
                                "--nproc-per-node=2", *flags, "--no-python", train, *args],
                               capture_output=True, text=True, env=env_with(), timeout=600)
            if p.returncode != 0:
                raise SystemExit(f"ddp-train failed ({m}):\n{p.stderr[-2000:]}")
            seen = [float(x) for x in re.findall(r"samples/s (\d+)", p.stdout + p.stderr)]
            rates[m].append(statistics.median(seen[1:] or seen))  # the first includes warm-up
    base = statistics.median(rates["off"])
    return {m: {"samples_per_s": round(statistics.median(v)),
                "step_time_ratio_to_off": round(base / statistics.median(v), 4),
                "reps": [round(x) for x in v]} for m, v in rates.items()}


def nvrx_path():
    d = os.environ.get("NVRX_DIR", os.path.expanduser("~/.cache/ddprun/nvrx"))
    return d if os.path.isdir(os.path.join(d, "nvidia_resiliency_ext")) else None


def same_fault(bin_dir, work):
    script = os.path.join(work, "g.py")
    open(script, "w").write(GLOO)
    hang_at = os.path.join(work, "hang_at_g")
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    ft = [sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher"]
    ft_flags = ["--ft-initial-rank-heartbeat-timeout=30", "--ft-rank-heartbeat-timeout=10",
                "--ft-workload-check-interval=1", "--max-restarts=0"]
    cases = [
        ("ddprun --hang-timeout=10", [os.path.join(bin_dir, "ddprun"), "--standalone",
                                      "--nproc-per-node=2", "--hang-timeout=10",
                                      "--on-hang=stop", script], {}, "none"),
        ("torchrun, pg timeout 20 s", [*torchrun, "--standalone", "--nproc-per-node=2", script],
         {"PG_TIMEOUT": "20"}, "timeout= in init_process_group"),
        ("torchrun, default pg timeout", [*torchrun, "--standalone", "--nproc-per-node=2",
                                          script], {}, "none"),
    ]
    nvrx = nvrx_path()
    if nvrx:
        cases += [
            ("ft_launcher, heartbeats", [*ft, "--standalone", "--nproc-per-node=2", *ft_flags,
                                         script], {"WITH_FT": "1", "PYTHONPATH": nvrx},
             "RankMonitorClient + send_heartbeat() per step"),
            ("ft_launcher, unmodified", [*ft, "--standalone", "--nproc-per-node=2", *ft_flags,
                                         script], {"PYTHONPATH": nvrx}, "none"),
        ]
    out = []
    for name, argv, extra, code in cases:
        if os.path.exists(hang_at):
            os.unlink(hang_at)
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             cwd=work, start_new_session=True, env=env_with(PYTHON_EXEC=sys.executable, HANG_AT=hang_at,
                                                    **extra))
        pattern = (r"ddprun: hang: no progress|Root Cause|FT timeout elapsed|"
                   r"Some rank\(s\) exited|ChildFailedError")
        when, texts = watch([p], pattern, NEVER + 15)
        start = float(open(hang_at).read()) if os.path.exists(hang_at) else None
        text = texts[0]
        if "ddprun: hang:" in text:
            m = re.search(r"Suspect[^\n]*\n\s+ranks ([0-9, ]+)", text)
            named = f"rank {m.group(1).strip()}" if m else "?"
        elif "Root Cause" in text:
            m = re.search(r"Root Cause.*?rank\s*:\s*(\d+)", text, re.S)
            named = f"rank {m.group(1)} (as root cause)" if m else "?"
        elif "FT timeout elapsed" in text:
            named = "every rank (all killed)"
        else:
            named = "nobody"
        detected = when is not None and start is not None and when - start <= NEVER
        out.append({"launcher": name, "code_needed": code, "detected": detected,
                    "names": named if detected else "nobody",
                    "seconds_after_hang": round(when - start, 2) if detected else None})
    if not nvrx:
        out.append({"launcher": "ft_launcher", "detected": None,
                    "note": "not importable: set NVRX_DIR (see the usage line)"})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/bin"))
    ap.add_argument("--quick", action="store_true", help="fewer reps, no 64-node run")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="hang-bench-")
    res = {"time_to_report": [time_to_report(a.bin, 2, 2, 2, work)]}
    if not a.quick:
        res["time_to_report"].append(time_to_report(a.bin, 64, 1, 2, work))
    res["overhead"] = overhead(a.bin, 2 if a.quick else 9, 3000, work)
    res["same_fault"] = same_fault(a.bin, work)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
