"""store_auth_bench: what the store secret costs (issue 22), or TLS (issue 35, --compare tls),
side by side in one run. The same ddprund binary is started without a secret and with one (a
mode-600 file), or plain and with DDPRUN_STORE_TLS_* (certificates made here by openssl,
tests/support/tls_certs.py), alternating, and driven by ddprun's own client
(bench/auth_load.cpp: with the secret every client authenticates with HMAC-SHA256
challenge-response; with TLS every connection does a TLS handshake, resuming the session its
process's first connection got; otherwise the bytes are the same):
  - the storm: 4096 clients connect at once, each ADD then WAIT (init_process_group's barrier);
  - throughput: 64 connections doing GET/SET for --seconds, connections opened in the window.
torch's clients cannot authenticate, so store_loadgen's raw torch traffic has no part in this.
Each cell is the median of --reps; the goal is under 5% on both. ddprund's own CPU time per
storm client (from /proc) is reported too: on a 2-core machine shared with the load it is the
steadier figure.

Reproduce (after ./scripts/test.sh, or ninja -C build ddprund auth_load):
  scripts/loopback_only.sh python3 bench/store_auth_bench.py --ddprund build/bin/ddprund \
      --load build/bin/auth_load --reps 5 --out bench/results/store_auth_bench.json
  scripts/loopback_only.sh python3 bench/store_auth_bench.py --compare tls --reps 5 \
      --out bench/results/store_tls_bench.json"""
import argparse
import json
import os
import statistics
import sys
import subprocess
import tempfile
import time


def start(ddprund, secret_file, env):
    d = tempfile.mkdtemp(prefix="auth-bench-")
    pf = os.path.join(d, "port")
    args = [ddprund, "--port", "0", "--port-file", pf, "--http-port", "-1"]
    if secret_file:
        args += ["--secret-file", secret_file]
    p = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(1000):
        if os.path.exists(pf):
            return p, int(open(pf).read())
        time.sleep(0.01)
    raise SystemExit(f"{ddprund} did not start")


def cpu_s(pid):
    """ddprund's user + system CPU seconds so far (/proc/PID/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(args, secret_file, tls, mode):
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDPRUN_STORE_")}
    env.update(tls or {})
    proc, port = start(args.ddprund, secret_file, env)
    try:
        if secret_file:
            env["DDPRUN_STORE_SECRET_FILE"] = secret_file
        cmd = [args.load, "--port", str(port), "--mode", mode]
        if mode == "storm":
            cmd += ["--clients", str(args.clients), "--threads", str(args.threads)]
        else:
            cmd += ["--conns", str(args.conns), "--seconds", str(args.seconds)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise SystemExit(f"auth_load failed: {out.stderr}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        return (r["seconds"] if mode == "storm" else r["ops_per_s"]), cpu_s(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprund", default="build/bin/ddprund")
    ap.add_argument("--load", default="build/bin/auth_load")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--clients", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=128)
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3)
    ap.add_argument("--out", default="bench/results/store_auth_bench.json")
    ap.add_argument("--compare", choices=("secret", "tls"), default="secret")
    args = ap.parse_args()
    tls_env = None
    if args.compare == "tls":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from support.tls_certs import make_pki, node_cert
        pki_dir = tempfile.mkdtemp(prefix="tls-bench-pki-")
        make_pki(pki_dir)
        cert, key = node_cert(pki_dir, "node", "IP:127.0.0.1")
        tls_env = {"DDPRUN_STORE_TLS_CERT": cert, "DDPRUN_STORE_TLS_KEY": key,
                   "DDPRUN_STORE_TLS_CA": os.path.join(pki_dir, "ca.pem")}
    d = tempfile.mkdtemp(prefix="auth-bench-secret-")
    secret_file = os.path.join(d, "secret")
    fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32).hex().encode())
    os.close(fd)
    runs = {("storm", False): [], ("storm", True): [], ("throughput", False): [],
            ("throughput", True): []}
    cpu = {k: [] for k in runs}
    for rep in range(args.reps):
        for mode in ("storm", "throughput"):
            # Alternate which goes first, so that drift does not favour one side.
            order = (False, True) if rep % 2 == 0 else (True, False)
            for with_secret in order:
                on = with_secret  # the variant: a secret, or TLS
                v, c = measure(args, secret_file if on and args.compare == "secret" else None,
                               tls_env if on else None, mode)
                runs[(mode, with_secret)].append(v)
                cpu[(mode, with_secret)].append(c)
                print(f"rep {rep} {mode} {args.compare}={with_secret}: {v:.4f} "
                      f"(ddprund CPU {c:.2f} s)",
                      flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    storm_cpu_us = {s: 1e6 * med_cpu[("storm", s)] / args.clients for s in (False, True)}
    storm_cost = med[("storm", True)] / med[("storm", False)] - 1
    tp_cost = 1 - med[("throughput", True)] / med[("throughput", False)]
    result = {
        "compare": args.compare,
        "clients": args.clients, "threads": args.threads, "conns": args.conns,
        "seconds": args.seconds, "reps": args.reps,
        "runs": {f"{m}_{args.compare if s else 'none'}": v for (m, s), v in runs.items()},
        "median": {f"{m}_{args.compare if s else 'none'}": v for (m, s), v in med.items()},
        "storm_cost": storm_cost, "throughput_cost": tp_cost,
        "ddprund_cpu_s": {f"{m}_{args.compare if s else 'none'}": v for (m, s), v in cpu.items()},
        "storm_ddprund_cpu_us_per_client": {"none": storm_cpu_us[False],
                                            args.compare: storm_cpu_us[True]},
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    label = ("without a secret", "with a secret") if args.compare == "secret" else ("plain", "TLS")
    print(f"\n| workload | {label[0]} | {label[1]} | cost |")
    print("|---|---:|---:|---:|")
    print(f"| storm, {args.clients} clients: seconds | {med[('storm', False)]:.3f} | "
          f"{med[('storm', True)]:.3f} | {100 * storm_cost:+.1f}% |")
    print(f"| {args.conns} connections: ops/s | {med[('throughput', False)]:.0f} | "
          f"{med[('throughput', True)]:.0f} | {100 * tp_cost:+.1f}% |")
    print(f"| storm: ddprund CPU per client, µs | {storm_cpu_us[False]:.1f} | "
          f"{storm_cpu_us[True]:.1f} | {100 * (storm_cpu_us[True] / storm_cpu_us[False] - 1):+.1f}% |")


if __name__ == "__main__":
    main()
