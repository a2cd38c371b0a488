"""Time from sbatch to the first training step, ddprun against torchrun, on the real local
Slurm cluster the Slurm tests use (2 nodes in their own network namespaces, tests/slurm).

The same PyTorch script (slurm/examples/ddp_toy.py, 2 ranks a node, gloo) is submitted through
slurm/torch-script-multinode-cpu.sbatch (srun ddprun) and bench/slurm/torchrun-multinode-cpu.sbatch
(srun torchrun, the recipe's flags), alternately, REPS times each. Each rank prints the wall clock
after its first optimizer step; "first step" is the last rank's, minus the time sbatch was called.
Also timed: sbatch to the job's end, and ddp-train (slurm/ddp-train-multinode-cpu.sbatch, 1 step).

  DDP_TORCH_VENV=~/.cache/ddprun/torch-venv REPS=5 \\
    ~/.cache/ddprun/torch-venv/bin/python bench/slurm_startup_bench.py
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "../tests/slurm"))
import conftest  # noqa: E402  (the cluster's settings and helpers)

REPS = int(os.environ.get("REPS", "5"))
TOY = os.path.join(conftest.ROOT, "slurm/examples/ddp_toy.py")


def run(cl, script, *args, env=None):
    t0 = time.time()
    jid = cl.sbatch(script, *args, env=env)
    deadline = time.monotonic() + 300
    while cl.running(jid):
        if time.monotonic() > deadline:
            cl.scancel(jid)
            raise SystemExit(f"job {jid} did not finish")
        time.sleep(0.05)
    t_end = time.time()
    state, code, _ = cl.state(jid)
    log = cl.log(jid)
    if (state, code) != ("COMPLETED", "0:0"):
        raise SystemExit(f"{script}: {state} {code}\n{log}")
    firsts = [float(t) for t in re.findall(r"first_step_unix (\d+\.\d+)", log)]
    return (max(firsts) - t0 if firsts else None), t_end - t0


def main():
    env = dict(os.environ)
    env.update(conftest.CLUSTER)
    up = subprocess.run([conftest.INFRA, "up"], env=env, capture_output=True, text=True)
    if up.returncode != 0:
        raise SystemExit(up.stdout + up.stderr)
    work = tempfile.mkdtemp(prefix="slurm-bench-")
    os.chmod(work, 0o755)
    cl = conftest.Cluster(work)
    ours = os.path.join(conftest.ROOT, "slurm/torch-script-multinode-cpu.sbatch")
    anchor = os.path.join(HERE, "slurm/torchrun-multinode-cpu.sbatch")
    trainer = os.path.join(conftest.ROOT, "slurm/ddp-train-multinode-cpu.sbatch")
    rows = {"ddprun": [], "torchrun": [], "ddprun+ddp-train": []}
    try:
        run(cl, ours, TOY, "--steps", "1")  # warm the page cache for both
        run(cl, anchor, TOY, "--steps", "1")
        for _ in range(REPS):
            rows["ddprun"].append(run(cl, ours, TOY, "--steps", "1"))
            rows["torchrun"].append(run(cl, anchor, TOY, "--steps", "1"))
            rows["ddprun+ddp-train"].append(
                run(cl, trainer, "--max-steps", "1", "--no-eval", "--train-subset", "256",
                    env={"EPOCHS": "1", "SAVE_EVERY": "0",
                         "SNAPSHOT": os.path.join(work, "bench.snapshot")}))
    finally:
        subprocess.run([conftest.INFRA, "down"], env=env, capture_output=True)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    print(f"sbatch -> first training step / job end, seconds, median of {REPS} (min-max)")
    for name, vals in rows.items():
        first = [f for f, _ in vals if f is not None]
        end = [e for _, e in vals]
        fs = (f"{med(first):6.2f} ({min(first):.2f}-{max(first):.2f})" if first
              else "     -           ")
        print(f"  {name:18s} first step {fs}   end {med(end):6.2f} ({min(end):.2f}-{max(end):.2f})")
    f_ours = med([f for f, _ in rows["ddprun"]])
    f_anchor = med([f for f, _ in rows["torchrun"]])
    e_ours = med([e for _, e in rows["ddprun"]])
    e_anchor = med([e for _, e in rows["torchrun"]])
    print(f"ratio torchrun/ddprun: first step {f_anchor / f_ours:.2f}x, job end "
          f"{e_anchor / e_ours:.2f}x")


if __name__ == "__main__":
    main()
