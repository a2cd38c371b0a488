"""A real 2-node Slurm 22.05 cluster for the Slurm tests, from ../shared/infra/local_slurm.sh:
munged, slurmctld and one slurmd per node, each node in its own network namespace with its own
address and hostname (netns mode: the blackhole route for the subnet is added first), 8 CPUs and
2 fake GPUs (GRES char devices: Slurm sets CUDA_VISIBLE_DEVICES, no CUDA behind it) per node.
Its own names, subnet and ports, so it never touches another local cluster; torn down at the end.
Jobs run with build/bin and the torch 2.x venv first on PATH (sbatch exports the environment)."""
import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BIN = os.environ.get("DDP_BIN_DIR", os.path.join(ROOT, "build/bin"))
# The team's tested recipe for a local Slurm (shared/infra): beside the clone or at /work when
# there, else the copy in tests/slurm/infra (taken from shared/infra unchanged), so a clone
# anywhere runs these tests.
INFRA = next((p for p in (os.environ.get("DDP_SLURM_INFRA", ""),
                          os.path.join(ROOT, "../shared/infra/local_slurm.sh"),
                          "/work/shared/infra/local_slurm.sh",
                          os.path.join(ROOT, "tests/slurm/infra/local_slurm.sh"))
              if p and os.path.exists(p)), None)
VENV = os.environ.get("DDP_TORCH_VENV", os.path.expanduser("~/.cache/ddprun/torch-venv"))
CLUSTER = {
    # On tmpfs, as the jobs' files (the cluster fixture, scripts/test.sh's --basetemp): slurmctld
    # fsyncs its state at every job change, ddp-train its snapshots, and on this machine's disk
    # an fsync behind a build's gigabytes of dirty pages stalled slurmctld (and every process
    # that touched the journal) for minutes: scontrol timed out after 120 s.
    "LOCAL_SLURM_DIR": "/dev/shm/ddprun-slurm-test",
    "LOCAL_SLURM_MODE": "netns",
    "LOCAL_SLURM_NODES": "2",
    "LOCAL_SLURM_NODE_PREFIX": "dn",
    "LOCAL_SLURM_CPUS": "8",
    "LOCAL_SLURM_GPUS": "2",
    "LOCAL_SLURM_SUBNET": "10.78.0",
    "LOCAL_SLURM_NS_PREFIX": "ddpsl",
    "LOCAL_SLURM_CTLD_PORT": "6917",
    "LOCAL_SLURM_SLURMD_PORT": "6918",
    "LOCAL_SLURM_MULTI_PORT_BASE": "17100",
}
JOB_TIMEOUT = 180  # seconds any one job may take before the test cancels it and fails


class Cluster:
    def __init__(self, workdir):
        self.workdir = workdir
        self.env = dict(os.environ)
        self.env.update(CLUSTER)
        self.env["SLURM_CONF"] = os.path.join(CLUSTER["LOCAL_SLURM_DIR"], "etc/slurm.conf")
        self.env["PATH"] = f"{BIN}:{VENV}/bin:" + self.env["PATH"]
        self.env.pop("OMP_NUM_THREADS", None)
        for k in list(self.env):
            if k.startswith(("SLURM_JOB", "SLURM_STEP", "PET_")):
                del self.env[k]

    def sbatch(self, script, *args, sbatch_opts=(), env=None):
        """Submits; returns the job id."""
        e = dict(self.env)
        e.update(env or {})
        out = subprocess.run(["sbatch", "--parsable", f"--chdir={self.workdir}",
                              f"--output={self.workdir}/%x-%j.out", *sbatch_opts, script, *args],
                             env=e, cwd=self.workdir, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, f"sbatch {script} failed: {out.stderr}"
        return out.stdout.strip().split(";")[0]

    def state(self, jid):
        # slurmctld on a loaded 2-core machine can miss scontrol's message timeout: scontrol then
        # prints an error and no job ("Socket timed out"), which must not read as "not running".
        # Asked again until it answers, within 120 s; a job slurmctld no longer knows is "?".
        deadline = time.monotonic() + 120
        while True:
            left = deadline - time.monotonic()
            try:
                p = subprocess.run(["scontrol", "show", "job", jid], env=self.env,
                                   capture_output=True, text=True, timeout=max(left, 1))
            except subprocess.TimeoutExpired:
                p = None
            out = p.stdout if p else ""
            if "JobState=" in out or (p and "Invalid job id" in p.stderr):
                break
            if time.monotonic() >= deadline:
                why = p.stderr.strip() if p else "no answer"
                pytest.fail(f"scontrol show job {jid}: {why} for 120 s\n{self.daemons()}")
            time.sleep(0.5)
        st = re.search(r"JobState=(\S+)", out)
        ec = re.search(r"ExitCode=(\S+)", out)
        name = re.search(r"JobName=(\S+)", out)
        return (st.group(1) if st else "?", ec.group(1) if ec else "?",
                name.group(1) if name else "?")

    def daemons(self):
        """What the cluster's daemons were doing: their processes and their logs' last lines (for
        a failure where slurmctld stopped answering)."""
        ps = subprocess.run(["ps", "-eo", "pid,stat,pcpu,etime,args"], capture_output=True,
                            text=True, timeout=30).stdout.splitlines()
        out = [line for line in ps if re.search(r"slurm|munge", line)]
        logdir = os.path.join(CLUSTER["LOCAL_SLURM_DIR"], "log")
        for name in sorted(os.listdir(logdir)) if os.path.isdir(logdir) else []:
            with open(os.path.join(logdir, name), errors="replace") as f:
                out += [f"--- {name}"] + f.read().splitlines()[-25:]
        return "\n".join(out)

    def running(self, jid):
        return self.state(jid)[0] in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING")

    def wait(self, jid, timeout=JOB_TIMEOUT):
        """Waits for the job to end (cancelling it at the timeout); returns (state, exit, log)."""
        deadline = time.monotonic() + timeout
        while self.running(jid):
            if time.monotonic() > deadline:
                subprocess.run(["scancel", jid], env=self.env, timeout=120)
                pytest.fail(f"job {jid} still running after {timeout} s:\n{self.log(jid)}")
            time.sleep(0.2)
        st, ec, _ = self.state(jid)
        return st, ec, self.log(jid)

    def log(self, jid):
        name = self.state(jid)[2]
        path = os.path.join(self.workdir, f"{name}-{jid}.out")
        return open(path).read() if os.path.exists(path) else ""

    def wait_for_line(self, jid, pattern, timeout=JOB_TIMEOUT):
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.log(jid)):
            if not self.running(jid) or time.monotonic() > deadline:
                subprocess.run(["scancel", jid], env=self.env, timeout=120)
                pytest.fail(f"job {jid}: no line matching {pattern!r}:\n{self.log(jid)}")
            time.sleep(0.1)

    def scontrol(self, *args):
        subprocess.run(["scontrol", *args], env=self.env, check=True, timeout=120)

    def scancel(self, jid, *opts):
        """scancel, again (3 tries) when slurmctld was too busy to answer in time ("Socket timed
        out on send/recv operation", exit 140 on a loaded 2-core machine) or scancel failed
        otherwise while the job still runs (once seen: exit 245, no message kept); a refusal
        of a job that no longer runs fails at once, with scancel's own words."""
        for attempt in range(3):
            p = subprocess.run(["scancel", *opts, jid], env=self.env, timeout=120,
                               capture_output=True, text=True)
            if p.returncode == 0:
                return
            busy = "timed out" in p.stderr or self.running(jid)
            if not busy or attempt == 2:
                raise AssertionError(f"scancel {' '.join(opts)} {jid}: exit {p.returncode}: "
                                     f"{p.stdout}{p.stderr}")
            time.sleep(2)

    def cancel_quietly(self, jid):
        """For finally: blocks, so a failed test never leaves a job holding the nodes."""
        if self.running(jid):
            subprocess.run(["scancel", jid], env=self.env, timeout=120)
            deadline = time.monotonic() + 30
            while self.running(jid) and time.monotonic() < deadline:
                time.sleep(0.2)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster needs root (network namespaces, munged)")
    if INFRA is None:
        pytest.skip("shared/infra/local_slurm.sh not found (set DDP_SLURM_INFRA)")
    if not os.path.exists(os.path.join(BIN, "ddprun")):
        pytest.fail(f"ddprun not found in {BIN}: build first or set DDP_BIN_DIR")
    env = dict(os.environ)
    env.update(CLUSTER)
    up = subprocess.run([INFRA, "up"], env=env, capture_output=True, text=True, timeout=600)
    if up.returncode != 0:
        pytest.fail("local_slurm.sh up failed:\n" + up.stdout + up.stderr)
    workdir = tempfile.mkdtemp(prefix="ddprun-slurm-jobs-", dir="/dev/shm")
    os.chmod(workdir, 0o755)
    try:
        yield Cluster(workdir)
    finally:
        subprocess.run([INFRA, "down"], env=env, capture_output=True, text=True, timeout=120)
        shutil.rmtree(workdir, ignore_errors=True)


def wait_gone(marker, timeout=10):
    """The live processes left with marker in their command line after up to timeout seconds
    (PID 1 may reap late; zombies count as gone)."""
    deadline = time.monotonic() + timeout
    while worker_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return worker_pids(marker)


def by_program(marker):
    """{program name: count} of the live processes whose command line contains marker."""
    counts = {}
    for _, cmd in worker_pids(marker):
        name = os.path.basename(cmd.split(" ", 1)[0])
        counts[name] = counts.get(name, 0) + 1
    return counts


def worker_pids(marker):
    """Live processes whose command line contains marker (zombies are dead)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmd and state != "Z":
            pids.append((int(d), cmd))
    return pids
