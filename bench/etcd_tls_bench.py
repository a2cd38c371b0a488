"""etcd-v3 rendezvous over https against http (issue 35), side by side in one run: two
single-member etcd 3.4 clusters on loopback, one plain, one serving https only with client
certificates (--client-cert-auth; certificates made by tests/support/tls_certs.py), and
build/bin/etcd_rdzv_bench timing one round of N agents on each, alternating, `--reps` times per
agent count. Each agent opens its own connections, so every round pays each agent's TLS
handshakes (the etcd client keeps one connection to a member and one per watch).

Reproduce (2-core VM, ~2 min):
  ~/.cache/ddprun/torch-venv/bin/python bench/etcd_tls_bench.py --agents 4,16,64 --reps 5
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "interop"))
sys.path.insert(0, str(REPO / "tests"))


def rounds(bench, endpoint, n, tag, tls=None):
    args = [bench, "--backend", "etcd", "--endpoints", endpoint, "--agents", str(n), "--reps",
            "1", "--tag", tag]
    if tls:
        args += ["--cacert", tls["ca"], "--cert", tls["client"], "--key", tls["client_key"]]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--agents", default="4,16,64")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    from etcd_cluster import EtcdCluster
    from support.tls_certs import make_pki
    bench = os.path.join(args.build, "bin", "etcd_rdzv_bench")
    pki = make_pki(tempfile.mkdtemp(prefix="ddp-tls-bench-"))
    plain, secure = EtcdCluster(1), EtcdCluster(1, tls=pki)
    got = {}
    try:
        for rep in range(args.reps):
            for n in map(int, args.agents.split(",")):
                for name, ep, tls in (("http", plain.endpoints[0], None),
                                      ("https", "https://" + secure.endpoints[0], pki)):
                    for r in rounds(bench, ep, n, f"{os.getpid()}-{name}-{rep}-{n}", tls):
                        got.setdefault((name, n), []).append(r["round_ms"])
                        print(json.dumps({"scheme": name, **r}), flush=True)
    finally:
        plain.stop()
        secure.stop()
    print("\n| agents | http round ms (median) | https round ms (median) | https / http |")
    print("|---:|---:|---:|---:|")
    table = []
    for n in map(int, args.agents.split(",")):
        h, s = statistics.median(got[("http", n)]), statistics.median(got[("https", n)])
        table.append({"agents": n, "http_ms": h, "https_ms": s, "ratio": s / h})
        print(f"| {n} | {h:.1f} | {s:.1f} | {s / h:.2f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
