"""Side-by-side launcher benchmark: ddprun against torch 2.x's torchrun.

Measures, alternating the two launchers in every repetition (ddprun, torchrun, ddprun, ...):
  launch   wall time of `LAUNCHER --standalone --nproc-per-node=N --no-python /bin/true`
  restart  with --max-restarts=1, the time from a worker's `kill -9 $$` to the start of its
           restarted replacement (timestamps taken by the worker itself), plus the whole job's
           wall time
Both launchers get the same flags (--monitor-interval left at its default) and the same
environment. Prints a markdown table of medians and torchrun/ddprun ratios; --json PATH also
writes every sample. Usually run through bench/run_launch_bench.sh.
"""
import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LAUNCHERS = ("ddprun", "torchrun")
LAUNCH_TARGET = 50.0   # torchrun/ddprun ratio the launch rows should reach
RESTART_TARGET = 10.0  # same for the restart latency

# The restart worker. Run 0 stamps the time and SIGKILLs itself; run 1 stamps its start time
# and exits 0. Stamps (ns since the epoch, from `date`) land next to the script.
RESTART_WORKER = """\
# Restart-latency worker for launch_bench.py: dies by SIGKILL on the first run, then succeeds.
dir=$(dirname "$0")
n=${TORCHELASTIC_RESTART_COUNT:-unset}
if [ "$n" = 0 ]; then
  date +%s%N >"$dir/killed.$n"
  kill -9 $$
fi
date +%s%N >"$dir/started.$n"
exit 0
"""


@dataclasses.dataclass
class Run:
    """One launcher invocation."""

    rc: int | None  # None: killed by the timeout
    wall_s: float
    stderr_tail: str


def parse_args() -> argparse.Namespace:
    venv = Path(os.environ.get("DDP_TORCH_VENV", Path.home() / ".cache/ddprun/torch-venv"))
    repo = Path(__file__).resolve().parent.parent
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ddprun", type=Path,
                   default=Path(os.environ.get("DDPRUN", repo / "build/bin/ddprun")),
                   help="ddprun binary (default: $DDPRUN or <repo>/build/bin/ddprun)")
    p.add_argument("--torchrun", type=Path, default=venv / "bin/torchrun",
                   help="torchrun (default: $DDP_TORCH_VENV/bin/torchrun, "
                        "DDP_TORCH_VENV defaulting to ~/.cache/ddprun/torch-venv)")
    p.add_argument("--reps", type=int, default=10, help="repetitions per launcher and row")
    p.add_argument("--nprocs", default="1,2,8", help="comma-separated --nproc-per-node values")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per launch")
    p.add_argument("--skip-restart", action="store_true", help="only the launch rows")
    p.add_argument("--json", type=Path, help="also write summary and samples here")
    return p.parse_args()


def bench_env() -> dict[str, str]:
    """The environment both launchers get: this one, minus anything that would configure
    torchrun (PET_*) or make the launcher think it runs inside another job."""
    drop_prefixes = ("PET_", "TORCHELASTIC_")
    drop = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT", "LOGLEVEL"}
    env = {k: v for k, v in os.environ.items()
           if k not in drop and not k.startswith(drop_prefixes)}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def launch(cmd: list[str], env: dict[str, str], timeout: float) -> Run:
    """Runs cmd in its own process group; on timeout the whole group (workers too) is
    SIGKILLed."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        rc = None
    wall = time.perf_counter() - start
    tail = err.decode(errors="replace").strip().splitlines()[-5:]
    return Run(rc, wall, "\n".join(tail))


def describe_failure(name: str, cmd: list[str], run: Run, why: str) -> str:
    what = "timed out" if run.rc is None else f"exit {run.rc}"
    return f"{name}: {why} ({what}): {' '.join(cmd)}\n    " + run.stderr_tail.replace(
        "\n", "\n    ")


def bench_launch(exes: dict[str, str], nproc: int, args, env, failures: list[str]):
    samples = {name: [] for name in LAUNCHERS}
    for _ in range(args.reps):
        for name in LAUNCHERS:
            cmd = [exes[name], "--standalone", f"--nproc-per-node={nproc}", "--no-python",
                   "/bin/true"]
            run = launch(cmd, env, args.timeout)
            if run.rc == 0:
                samples[name].append(run.wall_s * 1e3)
            else:
                failures.append(describe_failure(name, cmd, run, "launch failed"))
    return samples


def bench_restart(exes: dict[str, str], args, env, failures: list[str]):
    latency = {name: [] for name in LAUNCHERS}
    wall = {name: [] for name in LAUNCHERS}
    with tempfile.TemporaryDirectory(prefix="launch_bench.") as tmp:
        worker = Path(tmp) / "worker.sh"
        worker.write_text(RESTART_WORKER)
        killed, started = Path(tmp) / "killed.0", Path(tmp) / "started.1"

        def stamps() -> list[Path]:
            return sorted([*Path(tmp).glob("killed.*"), *Path(tmp).glob("started.*")])

        for _ in range(args.reps):
            for name in LAUNCHERS:
                for stamp in stamps():
                    stamp.unlink()
                cmd = [exes[name], "--standalone", "--nproc-per-node=1", "--max-restarts=1",
                       "--no-python", "/bin/sh", str(worker)]
                run = launch(cmd, env, args.timeout)
                if run.rc != 0:
                    failures.append(describe_failure(name, cmd, run, "restart job failed"))
                    continue
                if not (killed.exists() and started.exists()):
                    found = ", ".join(p.name for p in stamps()) or "none"
                    failures.append(describe_failure(
                        name, cmd, run, f"missing worker stamps (found: {found}; "
                        "is TORCHELASTIC_RESTART_COUNT set?)"))
                    continue
                gap_ns = int(started.read_text()) - int(killed.read_text())
                latency[name].append(gap_ns / 1e6)
                wall[name].append(run.wall_s * 1e3)
    return latency, wall


def summarize(measurement: str, n: int, samples: dict[str, list[float]], target: float):
    med = {name: statistics.median(s) if s else None for name, s in samples.items()}
    d, t = med["ddprun"], med["torchrun"]
    ratio = t / d if d and t else None
    return {"measurement": measurement, "n": n, "ddprun_median_ms": d,
            "torchrun_median_ms": t, "ratio": ratio, "target_ratio": target,
            "samples_ms": samples}


def fmt_ms(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.1f}" if v >= 10 else f"{v:.2f}"


def table(rows: list[dict]) -> str:
    lines = ["| measurement | N | ddprun median ms | torchrun median ms | ratio | target |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:,.1f}x"
        target = "" if r["target_ratio"] is None else f"≥ {r['target_ratio']:g}x"
        if r["ratio"] is not None and r["target_ratio"] is not None:
            target += " ok" if r["ratio"] >= r["target_ratio"] else " MISSED"
        lines.append(f"| {r['measurement']} | {r['n']} | {fmt_ms(r['ddprun_median_ms'])} | "
                     f"{fmt_ms(r['torchrun_median_ms'])} | {ratio} | {target} |")
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    exes = {"ddprun": str(args.ddprun), "torchrun": str(args.torchrun)}
    for name, exe in exes.items():
        if not os.access(exe, os.X_OK):
            print(f"launch_bench: {name} not found or not executable: {exe}", file=sys.stderr)
            return 2
    nprocs = [int(n) for n in args.nprocs.split(",") if n]
    env = bench_env()
    failures: list[str] = []

    # One untimed launch each, so torchrun's first import does not come from a cold page cache.
    for exe in exes.values():
        launch([exe, "--standalone", "--nproc-per-node=1", "--no-python", "/bin/true"], env,
               args.timeout)

    load_before = os.getloadavg()
    rows = []
    for n in nprocs:
        print(f"launch, nproc {n}: {args.reps} reps each ...", file=sys.stderr)
        rows.append(summarize("launch /bin/true", n,
                              bench_launch(exes, n, args, env, failures), LAUNCH_TARGET))
    if not args.skip_restart:
        print(f"restart after SIGKILL: {args.reps} reps each ...", file=sys.stderr)
        latency, wall = bench_restart(exes, args, env, failures)
        rows.append(summarize("restart latency (kill → restarted worker start)", 1, latency,
                              RESTART_TARGET))
        rows.append(summarize("restart job wall time", 1, wall, None))
    load_after = os.getloadavg()

    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "unknown (this python has no torch)"
    machine = {"nproc": os.cpu_count(), "platform": platform.platform(),
               "python": platform.python_version(), "torch": torch_version,
               "loadavg_before": load_before, "loadavg_after": load_after}
    print(f"ddprun ({exes['ddprun']}) vs torchrun ({exes['torchrun']}, torch {torch_version}); "
          f"{machine['nproc']} cores; loadavg {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after; median of {args.reps} reps, launchers alternated.\n")
    print(table(rows))
    print("\nratio: torchrun median / ddprun median. Wall times include fork/exec of the "
          "launcher; restart latency is measured by the worker itself (`date +%s%N` just "
          "before `kill -9 $$`, and on the restarted worker's start).")
    if failures:
        print(f"\nFailures ({len(failures)}):")
        for f in failures:
            print(f"- {f}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "reps": args.reps,
                                         "launchers": exes, "rows": rows,
                                         "failures": failures}, indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
