"""launch_cpu_bench: the CPU time of a launch (issue 37), side by side in one run: ddprun
starting N no-op workers against a bare shell starting the same N processes, alternated in every
repetition. CPU time is user + system of the launcher and everything it waited for (os.wait4's
rusage of the whole tree), so both sides include the N `/bin/true`s; the ratio is ddprun's
median over the shell's.

Reproduce: scripts/loopback_only.sh python3 bench/launch_cpu_bench.py --reps 200 [--nproc 2]
  [--ddprun build/bin/ddprun] [--json bench/results/launch_cpu.json]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def cpu_ms(argv):
    """(CPU ms of the whole tree, wall ms) of one run; stdout and stderr dropped."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        sys.exit(f"launch_cpu_bench: {argv[0]} exited {p.returncode}")
    return (ru.ru_utime + ru.ru_stime) * 1e3, (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--ddprun", default=os.path.join(HERE, "..", "build", "bin", "ddprun"))
    ap.add_argument("--json")
    a = ap.parse_args()
    if not 1 <= a.reps <= 10000 or not 1 <= a.nproc <= 64:
        sys.exit("launch_cpu_bench: --reps in 1..10000, --nproc in 1..64")
    sides = {
        "ddprun": [a.ddprun, "--standalone", f"--nproc-per-node={a.nproc}", "--no-python",
                   "/bin/true"],
        "shell": ["/bin/sh", "-c", " ".join(["/bin/true &"] * a.nproc) + " wait"],
    }
    for argv in sides.values():  # warm the page cache and the dynamic loader's files
        cpu_ms(argv)
    samples = {k: [] for k in sides}
    for _ in range(a.reps):
        for k, argv in sides.items():
            samples[k].append(cpu_ms(argv))
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
           for k, v in samples.items()}
    print(f"| launcher ({a.nproc} no-op workers, {a.reps} alternated reps) | CPU ms (median) "
          f"| wall ms (median) |\n|---|---:|---:|")
    for k, (c, w) in med.items():
        print(f"| {k} | {c:.2f} | {w:.2f} |")
    ratio = med["ddprun"][0] / med["shell"][0]
    print(f"\nddprun / shell CPU time: {ratio:.2f}x (goal <= 2x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"nproc": a.nproc, "reps": a.reps, "samples": samples, "ratio": ratio}, f)


if __name__ == "__main__":
    main()
