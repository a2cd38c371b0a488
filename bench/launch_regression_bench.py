"""launch_regression_bench: one ddprun against another, side by side in one run: the launch of
`--standalone --nproc-per-node=N --no-python /bin/true` and a one-restart job, alternated in
every repetition. The anchor is the ddprun of an earlier commit; used to show that a change to
the agent (issue 14's hardening, issue 15's lifecycle split) costs nothing measurable.

Reproduce (the baseline built from the earlier commit in a worktree):
  git worktree add /tmp/ddp-base <commit> && cmake -S /tmp/ddp-base -B /tmp/ddp-base/build -G Ninja \\
    && ninja -C /tmp/ddp-base/build ddprun
  scripts/loopback_only.sh python3 bench/launch_regression_bench.py \\
    --base /tmp/ddp-base/build/bin/ddprun --new build/bin/ddprun --reps 30"""
import argparse
import os
import statistics
import subprocess
import tempfile
import time


def once(binary, args):
    t = time.perf_counter()
    # No timeout here: Popen.wait(timeout) polls with sleeps that quantise the figure to ~8 ms.
    p = subprocess.run([binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert p.returncode == 0, (binary, args, p.returncode)
    return (time.perf_counter() - t) * 1000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    marker = tempfile.mkdtemp(prefix="launch-regress-")
    # A worker that fails once (first attempt), then succeeds: one restart of the whole group.
    restart = ["--standalone", "--nproc-per-node=1", "--max-restarts=1", "--no-python", "/bin/sh",
               "-c", f'f={marker}/$$RUN; [ "$TORCHELASTIC_RESTART_COUNT" = 1 ] || exit 3']
    cases = [(f"launch, N={n}", ["--standalone", f"--nproc-per-node={n}", "--no-python",
                                  "/bin/true"]) for n in (1, 2, 8)]
    cases.append(("one failure and one restart (wall)", restart))
    rows = []
    for name, args in cases:
        times = {"base": [], "new": []}
        for _ in range(a.reps):
            for which in ("base", "new"):
                times[which].append(once(getattr(a, which), args))
        b, n = statistics.median(times["base"]), statistics.median(times["new"])
        rows.append((name, b, n))
    print("| workload | base median ms | new median ms | new/base |")
    print("|---|---:|---:|---:|")
    for name, b, n in rows:
        print(f"| {name} | {b:.1f} | {n:.1f} | {n / b:.2f} |")
    os.rmdir(marker)


if __name__ == "__main__":
    main()
