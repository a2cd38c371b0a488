"""launcher_attacks_rss: ddprun's peak resident memory (VmHWM, read while it runs) under the
hostile launcher inputs of issue 14, for the table in docs/reliability.md. Each case is bounded:
a timeout, fixed counts, files only on a 1 MiB tmpfs when run as root in a private mount
namespace (tests/hostile/run.sh), else under RLIMIT_FSIZE.

Reproduce: tests/hostile/run.sh python3 bench/launcher_attacks_rss.py [BIN_DIR]"""
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../build/bin")
DDPRUN = os.path.join(BIN, "ddprun")
PY = "/usr/bin/python3"


def hwm_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(args, stop_after=None, timeout=120):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.Popen([DDPRUN, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=env, preexec_fn=lambda: resource.setrlimit(
                             resource.RLIMIT_FSIZE, (64 << 20, 64 << 20)))
    peak, t0 = 0, time.monotonic()
    while p.poll() is None and time.monotonic() - t0 < timeout:
        peak = max(peak, hwm_kib(p.pid))
        if stop_after is not None and time.monotonic() - t0 > stop_after:
            p.send_signal(signal.SIGTERM)
            stop_after = None
        time.sleep(0.005)
    if p.poll() is None:
        p.kill()
    err = p.communicate()[1].decode(errors="replace")
    return p.returncode, peak / 1024, err


def tmpfs(size_mib):
    d = tempfile.mkdtemp(prefix="ddp-rss-")
    ok = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", d],
                        capture_output=True).returncode == 0
    return d, ok


def main():
    rows = []
    rc, mib, _ = run(["--standalone", "--nproc-per-node=10000000", "--no-python", "/bin/true"])
    rows.append(("--nproc-per-node=10000000", f"exit {rc}", mib))
    line = "import sys; c=sys.argv[1]; [sys.stdout.write(c*(1<<20)+'\\n') for _ in range(8)]; sys.stdout.flush()"
    rc, mib, _ = run(["--standalone", "--nproc-per-node=2", "--no-python", PY, "-c", line, "${local_rank}"])
    rows.append(("2 ranks x 8 lines of 1 MiB to the console", f"exit {rc}", mib))
    noline = "import sys; [sys.stdout.write('x'*(1<<20)) for _ in range(64)]; sys.stdout.flush()"
    rc, mib, _ = run(["--standalone", "--nproc-per-node=1", "--no-python", PY, "-c", noline])
    rows.append(("one rank writes 64 MiB without a newline", f"exit {rc}", mib))
    d, mounted = tmpfs(1)
    big = "import sys; [print('y'*1000) for _ in range(16000)]"
    rc, mib, err = run(["--standalone", "--nproc-per-node=2", "--log-dir", d, "--tee=3",
                        "--no-python", PY, "-c", big])
    rows.append((f"2 ranks tee 16 MB each to a {'1 MiB tmpfs' if mounted else 'RLIMIT_FSIZE'} log dir",
                 f"exit {rc}, {err.count('No space left') + err.count('too large')} warning line(s)",
                 mib))
    if mounted:
        subprocess.run(["umount", "-l", d])
    rc, mib, _ = run(["--standalone", "--nproc-per-node=1000", "--max-nproc-per-node=1000",
                      "--log-dir", "/dev/null", "--no-python", "/bin/sleep", "30"], stop_after=3)
    rows.append(("1000 workers, SIGTERM 3 s in", f"exit {rc}", mib))
    print("| attack on ddprun | outcome | ddprun peak RSS |")
    print("|---|---|---:|")
    for what, outcome, mib in rows:
        print(f"| {what} | {outcome} | {mib:.1f} MiB |")


if __name__ == "__main__":
    main()
