"""recovery_sim: a failure process at 1k, 16k and 100k GPUs, replayed against three ways to
recover (issue 34, docs/perf.md): torchrun's whole-job restart, ddprun's whole-job restart and
ddprun's in-place recovery. Prints the effective training time ratio: the share of wall time
spent on steps that count.

The failure process (every figure a flag; the defaults are the assumptions docs/perf.md states):
- Failures arrive as a Poisson process at the Llama 3 run's rate: 419 unplanned interruptions in
  54 days on 16,384 GPUs, scaled linearly with the GPU count (--rate-gpu-hour); failures keep
  arriving during a recovery, which then starts again.
- Whole-job restarts (both launchers) lose the work since the last checkpoint (--ckpt-min
  minutes apart, each costing --ckpt-write-s of stall) and pay: detection, the agents' restart,
  the workers' start (--worker-start-s: Python and torch imports), the rendezvous at that node
  count, communicator init (--comm-init-s) and the checkpoint read (--ckpt-read-s).
  * torchrun's rendezvous: 1.2 s per round up to 8 nodes (measured, docs/perf.md), growing
    linearly to the published 10 s at 4000 hosts; its agents restart in --torchrun-agent-s.
  * ddprun's rendezvous: the measured rounds (0.23 s at 1024 agents, 0.86 s at 4096),
    linearly beyond; its agents do not restart (they outlive their workers).
- In-place recovery pays: detection (--heal-detect-s: a collective fails when a peer's
  connections close; a silent node is found by its lease, --lease-s), the heal measured by
  bench/recovery_bench.py (--heal-s: replacement start, regroup, state from a peer), the state
  transfer (--state-gb at --link-gbps), communicator rebuild (--comm-init-s, as a restart's), one
  step computed again (--step-s). --node-share of the failures take a whole node: its
  replacement comes from a spare (--spare-s), plus one rendezvous round.
- Checkpoints are written at the same interval under every scheme (in-place recovery keeps them
  as the fallback when both holders of a shard die), so their cost is the same for all.

Reproduce: python3 bench/recovery_sim.py [--days 54 --seed 1]
"""
import argparse
import math
import random


def ddprun_rdzv_s(nodes):
    # Measured rounds (docs/perf.md, issue 4): 0.234 s at 1024 agents, 0.864 s at 4096.
    if nodes <= 1024:
        return 0.234 * nodes / 1024
    return 0.234 + (0.864 - 0.234) * (nodes - 1024) / (4096 - 1024)


def torch_rdzv_s(nodes):
    return max(1.2, 10.0 * nodes / 4000)


def costs(a, gpus):
    nodes = max(1, gpus // a.gpus_per_node)
    common = a.detect_s + a.worker_start_s + a.comm_init_s + a.ckpt_read_s
    heal = a.heal_s + a.state_gb * 8 / a.link_gbps + a.comm_init_s + a.step_s
    node_heal = heal + a.spare_s + ddprun_rdzv_s(nodes) + a.lease_s
    return {
        "torchrun whole-job restart": {"fixed": common + a.torchrun_agent_s + torch_rdzv_s(nodes),
                                       "lose_since_ckpt": True},
        "ddprun whole-job restart": {"fixed": common + ddprun_rdzv_s(nodes),
                                     "lose_since_ckpt": True},
        "ddprun in-place recovery": {
            "fixed": a.heal_detect_s + (1 - a.node_share) * heal + a.node_share * node_heal,
            "lose_since_ckpt": False},
    }


def replay(rate_per_s, cost, a, rng):
    """Wall time and useful time over a.days: failures Poisson(rate) at any moment."""
    horizon = a.days * 86400.0
    ckpt_every = a.ckpt_min * 60.0
    t = useful = since_ckpt = 0.0
    next_fail = rng.expovariate(rate_per_s)
    while t < horizon:
        # Train until the next checkpoint or the next failure.
        to_ckpt = ckpt_every - since_ckpt
        if next_fail - t >= to_ckpt:
            t += to_ckpt + a.ckpt_write_s
            useful += to_ckpt
            since_ckpt = 0.0
            continue
        run = next_fail - t
        t = next_fail
        useful += run
        since_ckpt += run
        if cost["lose_since_ckpt"]:
            useful -= since_ckpt  # computed again after the restart
            since_ckpt = 0.0
        # Recover; a failure during the recovery starts it again.
        while True:
            nxt = t + rng.expovariate(rate_per_s)
            if nxt >= t + cost["fixed"]:
                t += cost["fixed"]
                next_fail = nxt
                break
            t = nxt
    return useful / t


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate-gpu-hour", type=float, default=419 / (54 * 24 * 16384))
    p.add_argument("--gpus", default="1024,16384,102400")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--days", type=float, default=54)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ckpt-min", type=float, default=30)
    p.add_argument("--ckpt-write-s", type=float, default=5)
    p.add_argument("--ckpt-read-s", type=float, default=60)
    p.add_argument("--detect-s", type=float, default=10)
    p.add_argument("--worker-start-s", type=float, default=20)
    p.add_argument("--torchrun-agent-s", type=float, default=5)
    p.add_argument("--comm-init-s", type=float, default=30)
    p.add_argument("--heal-detect-s", type=float, default=1)
    p.add_argument("--heal-s", type=float, default=0.2, help="bench/recovery_bench.py's figure")
    p.add_argument("--state-gb", type=float, default=16)
    p.add_argument("--link-gbps", type=float, default=400)
    p.add_argument("--step-s", type=float, default=5)
    p.add_argument("--node-share", type=float, default=0.8)
    p.add_argument("--spare-s", type=float, default=30)
    p.add_argument("--lease-s", type=float, default=10)
    a = p.parse_args()
    if not 0 <= a.node_share <= 1 or a.days <= 0 or a.days > 3650:
        p.error("--node-share must be in [0, 1] and --days in (0, 3650]")
    gpus = [int(g) for g in a.gpus.split(",")]
    if any(g < 1 or g > 10_000_000 for g in gpus):
        p.error("--gpus: counts in [1, 10000000]")
    print(f"failure rate {a.rate_gpu_hour:.3g} per GPU-hour (Llama 3: 419 in 54 days on 16384 "
          f"GPUs); {a.days:g} days replayed, seed {a.seed}")
    print(f"{'GPUs':>8} {'MTTF':>8}  " + "  ".join(f"{n:>28}" for n in costs(a, 1)))
    for g in gpus:
        rate = a.rate_gpu_hour * g / 3600.0
        row = []
        for name, cost in costs(a, g).items():
            rng = random.Random(a.seed)
            row.append(f"{100 * replay(rate, cost, a, rng):>6.2f}% ({cost['fixed']:>6.1f} s)")
        mttf_h = 1 / (rate * 3600) if rate > 0 else math.inf
        print(f"{g:>8} {mttf_h:>6.2f} h  " + "  ".join(f"{c:>28}" for c in row))
    print("each cell: effective training time ratio (the fixed cost of one recovery)")


if __name__ == "__main__":
    main()
