"""What torchrun and ddprun print, side by side, for the failures that matter on a GPU cluster
(README.md, "Why switch from torchrun"): a crashed rank's exit code, a rank killed by the OOM
killer, a hung rank, a restart, a killed launcher. Each case runs the same script under torch
2.15's torchrun and under ddprun (2 workers, --standalone, gloo on the CPU), each run bounded by
a timeout, and prints the lines each launcher gave and what was measured.

Reproduce (after ./scripts/test.sh or a build, in the test venv):
  scripts/loopback_only.sh ~/.cache/ddprun/torch-venv/bin/python bench/torchrun_vs_ddprun.py \\
      [--bin build/bin] [--out bench/results/torchrun_vs_ddprun.json]"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "interop"))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")

CRASH = "import os, sys, time\ntime.sleep(0.5)\nsys.exit(3 if os.environ['RANK'] == '1' else 0)\n"
CRASH_ONCE = textwrap.dedent("""
    import os, sys, time
    if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        sys.exit(3)
    time.sleep(0.2)
""")
HANG = textwrap.dedent("""
    import os, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for step in range(1000):
        if dist.get_rank() == 1 and step == 3:
            def stuck_here():
                time.sleep(3600)
            stuck_here()
        dist.all_reduce(t)
        time.sleep(0.1)
""")
SLEEPER = textwrap.dedent("""
    import os, time
    open(os.path.join(os.environ["OUT"], "pid." + os.environ["RANK"]), "w").write(str(os.getpid()))
    time.sleep(120)
""")
HOG = textwrap.dedent("""
    import os, sys, time
    hog = []
    if os.environ["RANK"] == "1":
        for _ in range(400):
            hog.append(b"x" * 10**7)
    time.sleep(2)
""")


def launch(launcher, tmp, script, flags=(), timeout=90, preexec_fn=None, env_extra=None):
    """Runs launcher --standalone --nproc-per-node=2 [flags] script in tmp; (rc, stderr, s)."""
    with open(os.path.join(tmp, "script.py"), "w") as f:
        f.write(script)
    env = dict(os.environ, OUT=tmp, **(env_extra or {}))
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    if launcher != TORCHRUN:
        env["PYTHON_EXEC"] = sys.executable
    t0 = time.monotonic()
    p = subprocess.Popen([launcher, "--standalone", "--nproc-per-node=2", *flags, "script.py"],
                         cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, preexec_fn=preexec_fn)
    try:
        _, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        kill_workers_in(tmp)  # torchrun's outlive it, and hold stderr open
        _, err = p.communicate()
        return None, err, time.monotonic() - t0
    return p.returncode, err, time.monotonic() - t0


def kill_workers_in(folder):
    """SIGKILLs the processes whose working folder is `folder`: this case's workers, which run
    in process groups of their own."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/cwd") == os.path.realpath(folder):
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass


def tail(text, pattern):
    """The lines of `text` that match `pattern`, without torchrun's logger prefixes."""
    return [re.sub(r"^\S+ \S+ \d+ \S+ ", "", line) for line in text.splitlines()
            if re.search(pattern, line)]


def case_crash(ddprun, tmp):
    out = {}
    for name, cmd in (("torchrun", TORCHRUN), ("ddprun", ddprun)):
        d = tempfile.mkdtemp(dir=tmp)
        rc, err, _ = launch(cmd, d, CRASH)
        out[name] = {"exit code": rc, "lines": tail(err, r"exitcode|rank\s*:")}
    return out


def case_oom(ddprun, tmp):
    import test_parity_failures as tpf
    try:
        # 1 GiB: torchrun's own Python (torch imported) must fit, so the OOM killer picks the hog.
        cgroup, procs, undo = tpf.make_memory_cgroup(1024 * 1024 * 1024)
    except (OSError, RuntimeError) as e:
        return {"skipped": f"no memory cgroup here: {e}"}
    out = {}
    try:
        for name, cmd in (("torchrun", TORCHRUN), ("ddprun", ddprun)):
            d = tempfile.mkdtemp(dir=tmp)
            rc, err, _ = launch(cmd, d, HOG, preexec_fn=lambda: tpf._write(procs, str(os.getpid())))
            out[name] = {"exit code": rc, "lines": tail(err, r"traceback|exitcode")}
    finally:
        tpf.remove_cgroup(cgroup, undo)
    return out


def case_hang(ddprun, tmp):
    out = {}
    for name, cmd, flags in (("torchrun", TORCHRUN, ()),
                             ("ddprun", ddprun, ("--hang-timeout=5", "--on-hang=stop"))):
        d = tempfile.mkdtemp(dir=tmp)
        rc, err, secs = launch(cmd, d, HANG, flags, timeout=45)
        named = tail(err, r"stuck_here|hang|stalled")
        out[name] = {"exit code": rc, "seconds": round(secs, 1),
                     "lines": named[:6] or ["(nothing in 45 s; killed)"]}
    return out


def case_restart(ddprun, tmp):
    out = {}
    for name, cmd in (("torchrun", TORCHRUN), ("ddprun", ddprun)):
        d = tempfile.mkdtemp(dir=tmp)
        rc, err, secs = launch(cmd, d, CRASH_ONCE, ("--max-restarts=1",))
        out[name] = {"exit code": rc, "whole job, s": round(secs, 2),
                     "lines": tail(err, r"[Rr]estart")[:3]}
    return out


def case_killed_launcher(ddprun, tmp):
    out = {}
    for name, cmd in (("torchrun", TORCHRUN), ("ddprun", ddprun)):
        d = tempfile.mkdtemp(dir=tmp)
        with open(os.path.join(d, "script.py"), "w") as f:
            f.write(SLEEPER)
        env = dict(os.environ, OUT=d, PYTHON_EXEC=sys.executable)
        p = subprocess.Popen([cmd, "--standalone", "--nproc-per-node=2", "script.py"], cwd=d,
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        pids, deadline = [], time.monotonic() + 60
        while len(pids) < 2 and time.monotonic() < deadline:
            pids = [f for f in os.listdir(d) if f.startswith("pid.")]
            time.sleep(0.1)
        workers = [int(open(os.path.join(d, f)).read()) for f in pids]
        p.send_signal(signal.SIGKILL)
        p.wait()
        time.sleep(3)
        alive = [w for w in workers if os.path.exists(f"/proc/{w}")
                 and open(f"/proc/{w}/stat").read().split()[2] != "Z"]
        for w in alive:  # ours: the sleepers this case started
            os.kill(w, signal.SIGKILL)
        out[name] = {"workers": len(workers), "alive 3 s after the launcher's SIGKILL": len(alive)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--out")
    ap.add_argument("--cases", default="crash,oom,hang,restart,killed",
                    help="which cases, comma-separated (default: all)")
    a = ap.parse_args()
    os.environ["DDP_BIN_DIR"] = a.bin
    ddprun = os.path.join(a.bin, "ddprun")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for key, name, fn in (("crash", "a crashed rank", case_crash),
                              ("oom", "an OOM-killed rank", case_oom),
                              ("hang", "a hung rank", case_hang),
                              ("restart", "one restart", case_restart),
                              ("killed", "a killed launcher", case_killed_launcher)):
            if key not in a.cases.split(","):
                continue
            results[name] = fn(ddprun, tmp)
            print(f"== {name}")
            print(json.dumps(results[name], indent=1))
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
