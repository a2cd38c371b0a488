"""Benchmark of torch's own c10d dynamic rendezvous (the one torchrun uses), for comparison with
ddprun's rendezvous on the same store server.

For each N in --agents, N separate agent processes (torchrun's agents are processes) complete
one rendezvous round with min_nodes=max_nodes=N through torch's real handler:
registry.get_rendezvous_handler(RendezvousParameters(backend="c10d", ..., is_host=False)).
The store is a fresh ddprund per round (--store ddprund, the default) or torch's own TCPStore
server hosted in this process (--store torch).

Timing excludes interpreter start, `import torch` and handler creation. Every agent builds its
handler, then reports ready through a bookkeeping TCPStore client of its own and blocks on a
"go" key. The parent takes T_go = time.monotonic() just before it sets "go"; each agent adds 1
to a "done" counter once next_rendezvous() has returned, the last one sets a key, and the
parent takes T_end when its wait on that key returns. Round time = T_end - T_go. This covers
torch's 0-0.3 s random first-round delay, its 1 s SYNC polling, and rank 0 setting up the
shared TCPStore server plus the MASTER_ADDR/MASTER_PORT exchange inside next_rendezvous().

Store requests (ddprund only) come from the "served N connections, M requests" line ddprund
logs on SIGTERM, once every agent has exited. The bench's own requests are subtracted: the
ops are counted in this file, and the cost of a TCPStore client's connect handshake is measured
once at start against a throwaway ddprund. What remains per agent is what torch's rendezvous
itself sent: handler creation (its TCPStore connect, the state-init CAS) plus next_rendezvous().

Prints a markdown table; --json PATH also writes every sample. Run it with a torch 2.x python:
  /root/.cache/ddprun/torch-venv/bin/python bench/torch_rdzv_bench.py --agents 2,4,8 --reps 2
"""
import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"

# Bookkeeping keys. The store is fresh for every round, so they need no per-round prefix.
READY, ALL_READY, GO, DONE, ALL_DONE = (
    "bench/ready", "bench/all_ready", "bench/go", "bench/done", "bench/all_done")
OK = b"ok"

# Wire requests per torch TCPStore client call, as ddprund counts them. get() is WAIT + GET.
# calibrate() checks these against a real ddprund.
OP_COST = {"add": 1, "set": 1, "wait": 1, "check": 1, "get": 2}
# Bookkeeping ops of one agent: add(READY), wait(GO), add(DONE), plus one set(ALL_READY) and
# one set(ALL_DONE) from whichever agents come last (so two per round, not per agent).
AGENT_OPS = ("add", "wait", "add")
ROUND_AGENT_OPS = ("set", "set")
# The parent: wait(ALL_READY), get(ALL_READY), set(GO), wait(ALL_DONE), get(ALL_DONE).
PARENT_OPS = ("wait", "get", "set", "wait", "get")

SERVED_RE = re.compile(r"served (\d+) connections, (\d+) requests")


def cost(ops) -> int:
    return sum(OP_COST[op] for op in ops)


# --------------------------------------------------------------------------------------------
# Agent (child process)


def agent_main(args: argparse.Namespace) -> None:
    """One rendezvous agent. Writes its timings as JSON to args.out; exits non-zero on error.
    SIGALRM with its default action bounds the whole process, even inside a blocking C++ call
    that holds the GIL."""
    signal.alarm(args.timeout)
    t_start = time.monotonic()
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
    t_imported = time.monotonic()

    store = dist.TCPStore(HOST, args.port, is_master=False,
                          timeout=datetime.timedelta(seconds=args.timeout))
    try:
        params = RendezvousParameters(
            backend="c10d", endpoint=f"{HOST}:{args.port}", run_id=args.run_id,
            min_nodes=args.nodes, max_nodes=args.nodes, is_host=False,
            join_timeout=args.join_timeout, last_call_timeout=args.last_call_timeout)
        handler = get_rendezvous_handler(params)
        t_handler = time.monotonic()

        if store.add(READY, 1) == args.nodes:
            store.set(ALL_READY, OK)
        store.wait([GO])
        t_go_seen = time.monotonic()

        info = handler.next_rendezvous()
        t_rdzv = time.monotonic()
        # torch >= 2.4 returns RendezvousInfo; older versions a (store, rank, world_size) tuple.
        rank, world = ((info.rank, info.world_size) if hasattr(info, "rank")
                       else (info[1], info[2]))

        result = dict(pid=os.getpid(), rank=rank, world_size=world,
                      import_s=t_imported - t_start, handler_s=t_handler - t_imported,
                      t_go_seen=t_go_seen, t_rdzv=t_rdzv, rdzv_s=t_rdzv - t_go_seen)
        Path(args.out).write_text(json.dumps(result))
        if store.add(DONE, 1) == args.nodes:
            store.set(ALL_DONE, OK)
    except BaseException as e:
        # Wake the parent at once instead of letting it sit out its timeout. Only this agent
        # can write these keys now: the counters it did not bump can never reach N.
        msg = f"fail: pid {os.getpid()}: {type(e).__name__}: {e}".encode()
        for key in (ALL_READY, ALL_DONE):
            try:
                store.set(key, msg)
            except Exception:
                pass
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the keep-alive timer and rank 0's shared store server would
    # only add time (and, after 5 s, keep-alive requests) to a round that is already over.
    os._exit(0)


# --------------------------------------------------------------------------------------------
# Stores


class Ddprund:
    """A fresh ddprund on 127.0.0.1:0; stop() sends SIGTERM and returns its request counters."""

    def __init__(self, binary: Path, workdir: Path):
        port_file = workdir / "port"
        self.log_path = workdir / "ddprund.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [str(binary), "--host", HOST, "--port", "0", "--port-file", str(port_file)],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("ddprund did not start: " + self.log_path.read_text())
            time.sleep(0.005)
        self.port = int(port_file.read_text())

    def stop(self) -> tuple[int, int] | None:
        """(connections, requests) from the shutdown log line, or None if it is missing."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        m = SERVED_RE.search(self.log_path.read_text())
        return (int(m[1]), int(m[2])) if m else None


def client(port: int, timeout_s: float):
    import torch.distributed as dist
    return dist.TCPStore(HOST, port, is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def calibrate(binary: Path, workdir: Path) -> int:
    """Requests a bare TCPStore client connect costs on ddprund, with OP_COST checked too."""
    d = Ddprund(binary, workdir / "cal-connect")
    s = client(d.port, 10)
    del s
    connect = d.stop()[1]

    d = Ddprund(binary, workdir / "cal-ops")
    s = client(d.port, 10)
    s.add("k", 1)
    s.set("v", "x")
    s.wait(["v"])
    s.check(["v"])
    s.get("v")
    del s
    total = d.stop()[1]
    if total != connect + sum(OP_COST.values()):
        raise RuntimeError(f"OP_COST does not match ddprund's counts: connect={connect} "
                           f"connect+ops={total}, expected ops={sum(OP_COST.values())}")
    return connect


# --------------------------------------------------------------------------------------------
# Parent


@dataclass
class Round:
    agents: int
    rep: int
    store: str
    ok: bool = False
    error: str = ""
    round_s: float | None = None
    connections: int | None = None
    requests_raw: int | None = None      # everything ddprund served in this round
    requests_bench: int | None = None    # our bookkeeping part of it
    requests_per_agent: float | None = None  # (raw - bench) / N: torch's rendezvous only
    children: list = field(default_factory=list)


def watch_agents(procs: list[subprocess.Popen], port: int, stop: threading.Event) -> None:
    """Fails the round as soon as an agent dies (an agent exits 0 only after its DONE): sets
    both keys the parent may be blocked on, through a connection of its own. torch's wait()
    releases the GIL, so this thread runs while the parent blocks."""
    while not stop.wait(0.02):
        dead = [(i, p.returncode) for i, p in enumerate(procs) if p.poll() not in (None, 0)]
        if dead:
            s = client(port, 10)
            for key in (ALL_READY, ALL_DONE):
                s.set(key, f"fail: agent {dead[0][0]} exited {dead[0][1]}")
            return


def run_round(args, n: int, rep: int, connect_cost: int | None, workdir: Path) -> Round:
    r = Round(agents=n, rep=rep, store=args.store)
    workdir.mkdir(parents=True)
    daemon = None
    host_store = None
    store = None
    stop_watch = threading.Event()
    watcher = None
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        if args.store == "ddprund":
            (workdir / "ddprund").mkdir()
            daemon = Ddprund(args.ddprund, workdir / "ddprund")
            port = daemon.port
            store = client(port, args.timeout)
        else:
            import torch.distributed as dist
            host_store = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=args.timeout))
            port, store = host_store.port, host_store

        run_id = uuid.uuid4().hex
        for i in range(n):
            log = open(workdir / f"agent{i}.log", "w")
            logs.append(log)
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--agent", "--port", str(port), "--run-id", run_id,
                 "--nodes", str(n), "--out", str(workdir / f"agent{i}.json"),
                 "--timeout", str(args.timeout), "--join-timeout", str(args.join_timeout),
                 "--last-call-timeout", str(args.last_call_timeout)],
                stdout=log, stderr=subprocess.STDOUT))
        watcher = threading.Thread(target=watch_agents, args=(procs, port, stop_watch),
                                   daemon=True)
        watcher.start()

        # Agents' SIGALRM fires after args.timeout; ours a bit later, so a wedged agent shows
        # up as a failed agent rather than as a parent timeout.
        wait_s = datetime.timedelta(seconds=args.timeout + 5)
        store.wait([ALL_READY], wait_s)
        if (v := store.get(ALL_READY)) != OK:
            raise RuntimeError(v.decode())
        t_go = time.monotonic()
        store.set(GO, OK)
        store.wait([ALL_DONE], wait_s)
        t_end = time.monotonic()
        if (v := store.get(ALL_DONE)) != OK:
            raise RuntimeError(v.decode())
        r.round_s = t_end - t_go
        stop_watch.set()
        watcher.join()

        for i, p in enumerate(procs):
            rc = p.wait(timeout=30)
            if rc != 0:
                raise RuntimeError(f"agent {i} exited {rc}")
            child = json.loads((workdir / f"agent{i}.json").read_text())
            child["rdzv_done_after_go_s"] = child.pop("t_rdzv") - t_go
            child["go_seen_after_go_s"] = child.pop("t_go_seen") - t_go
            r.children.append(child)
        ranks = sorted(c["rank"] for c in r.children)
        if ranks != list(range(n)) or any(c["world_size"] != n for c in r.children):
            raise RuntimeError(f"bad ranks/world sizes: {ranks}")
        r.ok = True
    except Exception as e:
        r.error = f"{type(e).__name__}: {e}"
    finally:
        stop_watch.set()
        if watcher:
            watcher.join()
        grace_end = time.monotonic() + 2  # lets failing agents finish their tracebacks
        for p in procs:  # only the processes this function started
            try:
                p.wait(timeout=max(0.0, grace_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
        if not r.ok:  # the agents are reaped, so their logs are complete
            for i in range(len(logs)):
                tail = (workdir / f"agent{i}.log").read_text()[-1500:]
                if tail.strip():
                    r.error += f"\n--- agent {i} log tail ---\n{tail}"
        if daemon:
            del store
            served = daemon.stop()
            if served and r.ok and connect_cost is not None:
                r.connections, r.requests_raw = served
                r.requests_bench = ((n + 1) * connect_cost + n * cost(AGENT_OPS)
                                    + cost(ROUND_AGENT_OPS) + cost(PARENT_OPS))
                r.requests_per_agent = (r.requests_raw - r.requests_bench) / n
        del host_store
    return r


def fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def table(rounds: list[Round], ns: list[int], store: str) -> str:
    lines = [
        f"torch c10d dynamic rendezvous, {store} store: one round, min_nodes=max_nodes=N, "
        "one process per agent",
        "",
        "| N | round s (median) | round s (each rep) | agent next_rendezvous s (median) "
        "| store requests / agent | import s / process (median) | failed reps |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in ns:
        good = [r for r in rounds if r.agents == n and r.ok]
        failed = sum(1 for r in rounds if r.agents == n and not r.ok)
        times = [r.round_s for r in good]
        kids = [c for r in good for c in r.children]
        reqs = [r.requests_per_agent for r in good if r.requests_per_agent is not None]
        lines.append("| {} | {} | {} | {} | {} | {} | {} |".format(
            n,
            fmt(statistics.median(times) if times else None, ".3f"),
            ", ".join(f"{t:.3f}" for t in times) or "n/a",
            fmt(statistics.median(c["rdzv_s"] for c in kids) if kids else None, ".3f"),
            fmt(statistics.median(reqs) if reqs else None, ".1f"),
            fmt(statistics.median(c["import_s"] for c in kids) if kids else None, ".2f"),
            failed))
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", default="2,4,8,16", help="comma-separated N values")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--store", choices=["ddprund", "torch"], default="ddprund")
    p.add_argument("--ddprund", type=Path, default=Path(
        os.environ.get("DDP_BIN_DIR", REPO / "build" / "bin")) / "ddprund")
    p.add_argument("--join-timeout", type=int, default=60)
    p.add_argument("--last-call-timeout", type=int, default=30,
                   help="torch's default; unused when min_nodes == max_nodes")
    p.add_argument("--timeout", type=int, default=180,
                   help="bound on one agent process, import included (seconds)")
    p.add_argument("--json", type=Path, help="write every sample here")
    # Internal: run as one agent.
    p.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--run-id", help=argparse.SUPPRESS)
    p.add_argument("--nodes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    if args.agent:
        agent_main(args)
        return 0
    ns = [int(x) for x in args.agents.split(",")]
    if args.store == "ddprund" and not args.ddprund.exists():
        sys.exit(f"ddprund not found at {args.ddprund}: build first or pass --ddprund")

    import torch
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="torch-rdzv-bench-") as tmp:
        tmp = Path(tmp)
        connect_cost = None
        if args.store == "ddprund":
            (tmp / "cal-connect").mkdir()
            (tmp / "cal-ops").mkdir()
            connect_cost = calibrate(args.ddprund, tmp)
        for rep in range(args.reps):
            for n in ns:
                r = run_round(args, n, rep, connect_cost, tmp / f"n{n}-rep{rep}")
                status = f"{r.round_s:.3f} s" if r.ok else "FAILED: " + r.error
                print(f"N={n} rep={rep}: {status}", file=sys.stderr, flush=True)
                rounds.append(r)

    print(table(rounds, ns, args.store))
    if args.store == "ddprund":
        print(f"\nstore requests / agent = (all requests ddprund served in the round - the "
              f"bench's own) / N. The bench's own, per round: (N+1) TCPStore connects at "
              f"{connect_cost} requests each (measured), {cost(AGENT_OPS)} per agent + "
              f"{cost(ROUND_AGENT_OPS)} per round for ready/go/done, {cost(PARENT_OPS)} for "
              f"the parent. Included: torch's handler creation (its TCPStore connect, the "
              f"state-init CAS) and next_rendezvous(), nothing after it.")
    if args.json:
        args.json.write_text(json.dumps(dict(
            torch=torch.__version__, python=sys.version.split()[0], store=args.store,
            connect_cost=connect_cost, cpus=os.cpu_count(),
            rounds=[asdict(r) for r in rounds]), indent=1))
    return 0 if all(r.ok for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
