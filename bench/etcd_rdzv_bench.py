"""Side-by-side rendezvous on etcd (issue 21): one round of N agents (processes on loopback)
through ddprun's etcd-v3 backend, ddprun's c10d backend (a ddprund) and torchrun's etcd-v2
backend (torch's DynamicRendezvousHandler over python-etcd), all against the same etcd 3.4
member (v2 enabled); then the time to re-form after one agent is SIGKILLed (etcd-v3 and c10d).

ddprun's two backends are timed by build/bin/etcd_rdzv_bench (agents forked, connected before
the clock starts). torch's agents are Python processes: each imports torch and builds its
handler first, then spins on a "go" file; the round time is the last agent's
time.monotonic() after next_rendezvous() returned minus the parent's time.monotonic() just
before it created the file (CLOCK_MONOTONIC is one clock for every process). etcd requests:
ddprun counts its own; for torch's v2 client the v2 store's reads, writes and watches from
etcd's /metrics (etcd_debugging_store_*) are reported instead.

Goal: etcd-v3 within 2x of c10d and at least 5x faster than torchrun's etcd-v2 at 64 agents.
Reproduce (2-core VM, ~5 min):
  ~/.cache/ddprun/torch-venv/bin/python bench/etcd_rdzv_bench.py \
      --out bench/results/etcd_rdzv_bench.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "interop"))
sys.path.append(str(REPO / "tests"))  # support/, after interop/ (its conftest)


def torch_agent(args):
    """One torchrun etcd-v2 agent: handler first, then the go file, then one round."""
    import signal
    signal.alarm(args.timeout)
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
    params = RendezvousParameters(backend="etcd-v2", endpoint=args.endpoint, run_id=args.run_id,
                                  min_nodes=args.nodes, max_nodes=args.nodes,
                                  join_timeout=args.timeout, last_call_timeout=1)
    handler = get_rendezvous_handler(params)
    Path(args.out + ".ready").touch()
    while not os.path.exists(args.go):
        time.sleep(0.0005)
    info = handler.next_rendezvous()
    t = time.monotonic()
    Path(args.out).write_text(json.dumps({"t_done": t, "rank": info.rank,
                                          "world_size": info.world_size}))
    sys.stdout.flush()
    os._exit(0)


def v2_ops(endpoint):
    text = urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(("etcd_debugging_store_reads_total", "etcd_debugging_store_writes_total",
                            "etcd_debugging_store_watch_requests_total")):
            total += float(line.split()[-1])
    return total


def torch_round(endpoint, n, workdir, timeout):
    d = Path(tempfile.mkdtemp(dir=workdir))
    run_id = f"torch-{uuid.uuid4()}"
    go = str(d / "go")
    procs = [subprocess.Popen([sys.executable, __file__, "--agent", "--endpoint", endpoint,
                               "--run-id", run_id, "--nodes", str(n), "--go", go,
                               "--out", str(d / f"a{i}.json"), "--timeout", str(timeout)],
                              stdout=subprocess.DEVNULL, stderr=open(d / f"a{i}.err", "w"))
             for i in range(n)]
    try:
        deadline = time.monotonic() + timeout
        while sum((d / f"a{i}.json.ready").exists() for i in range(n)) < n:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("torch agents did not get ready: " +
                                   (d / "a0.err").read_text()[-2000:])
            time.sleep(0.01)
        before = v2_ops(endpoint)
        t_go = time.monotonic()
        Path(go).touch()
        for p in procs:
            p.wait(timeout=timeout)
        after = v2_ops(endpoint)
        done = [json.loads((d / f"a{i}.json").read_text()) for i in range(n)]
        assert sorted(x["rank"] for x in done) == list(range(n))
        return {"backend": "torchrun etcd-v2", "agents": n,
                "round_ms": (max(x["t_done"] for x in done) - t_go) * 1000,
                "v2_ops_per_agent": (after - before) / n}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def ddprun_rounds(binary, backend, endpoint, agents, reps, reform, lease_ms, tag):
    cmd = [binary, "--backend", backend, "--endpoints", endpoint, "--agents", agents,
           "--reps", str(reps), "--tag", tag, "--lease-ms", str(lease_ms)]
    if reform:
        cmd += ["--reform", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--endpoint")
    ap.add_argument("--run-id")
    ap.add_argument("--nodes", type=int)
    ap.add_argument("--go")
    ap.add_argument("--out")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--agents", default="4,16,64,256")
    ap.add_argument("--torch-agents", default="4,16,64")
    ap.add_argument("--reform-agents", default="4,16,64")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lease-ms", type=int, default=2000)
    args = ap.parse_args()
    if args.agent:
        return torch_agent(args)
    import etcd  # noqa: F401  python-etcd: scripts/setup.sh --with-torch installs it
    from conftest import Daemon
    from etcd_cluster import EtcdCluster
    bench = os.path.join(args.build, "bin", "etcd_rdzv_bench")
    os.environ["DDP_BIN_DIR"] = os.path.join(args.build, "bin")
    cluster = EtcdCluster(1, v2=True)
    daemon = Daemon()
    results = []
    try:
        ep = cluster.endpoints[0]
        c10d = f"127.0.0.1:{daemon.port}"
        for rep in range(args.reps):  # interleaved: the three backends see the same machine
            tag = f"{os.getpid()}-{rep}"
            results += ddprun_rounds(bench, "etcd", ep, args.agents, 1, False, args.lease_ms, tag)
            results += ddprun_rounds(bench, "c10d", c10d, args.agents, 1, False, args.lease_ms,
                                     tag)
            for n in [int(x) for x in args.torch_agents.split(",") if x]:  # "": none
                r = torch_round(ep, n, cluster.dir, args.timeout)
                r["measure"] = "round"
                results.append(r)
                print(json.dumps(r), flush=True)
        for backend, where in (("etcd", ep), ("c10d", c10d)) if args.reform_agents else ():
            results += ddprun_rounds(bench, backend, where, args.reform_agents, args.reps, True,
                                     args.lease_ms, f"{os.getpid()}-reform")
    finally:
        daemon.stop()
        cluster.stop()
    name = {"etcd": "ddprun etcd-v3", "c10d": "ddprun c10d"}
    table = {}
    for r in results:
        b = name.get(r["backend"], r["backend"])
        table.setdefault((r["measure"], b, r["agents"]), []).append(r)
    print("\n| agents | ddprun etcd-v3 ms | ddprun c10d ms | torchrun etcd-v2 ms | v3 / c10d | "
          "etcd-v2 / v3 | v3 requests per agent | v2 store ops per agent |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    agents = sorted({k[2] for k in table if k[0] == "round"})
    med = lambda rs, f: statistics.median(x[f] for x in rs) if rs else None
    for n in agents:
        v3 = med(table.get(("round", "ddprun etcd-v3", n)), "round_ms")
        c = med(table.get(("round", "ddprun c10d", n)), "round_ms")
        t = med(table.get(("round", "torchrun etcd-v2", n)), "round_ms")
        req = med(table.get(("round", "ddprun etcd-v3", n)), "requests_per_agent")
        ops = med(table.get(("round", "torchrun etcd-v2", n)), "v2_ops_per_agent")
        f = lambda v, p=1: "-" if v is None else f"{v:.{p}f}"
        print(f"| {n} | {f(v3)} | {f(c)} | {f(t)} | {f(v3 / c if v3 and c else None, 2)} | "
              f"{f(t / v3 if t and v3 else None)} | {f(req)} | {f(ops)} |")
    print("\n| agents | re-form etcd-v3 ms (lease "
          f"{args.lease_ms} ms) | re-form c10d ms |\n|---:|---:|---:|")
    for n in sorted({k[2] for k in table if k[0] == "reform"}):
        v3 = med(table.get(("reform", "ddprun etcd-v3", n)), "reform_ms")
        c = med(table.get(("reform", "ddprun c10d", n)), "reform_ms")
        print(f"| {n} | {v3:.0f} | {c:.0f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"reps": args.reps, "lease_ms": args.lease_ms,
                                              "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
