"""ddprun under hostile input and hostile workers (issue 14): absurd counts, a stop signal while
thousands of workers are being spawned, a full disk under --log-dir, fds leaking into workers,
1 MiB lines from two ranks at once, and workers that leave children, double forks and setsid'ed
daemons behind when the agent gets SIGTERM or SIGKILL. Every test is bounded: timeouts, small
tmpfs mounts (or RLIMIT_FSIZE), and it kills only the pids it started or recorded."""
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

BIN = os.environ.get("DDP_BIN_DIR", os.path.join(os.path.dirname(__file__), "../../build/bin"))
DDPRUN = os.path.join(BIN, "ddprun")
PY = sys.executable


def ddprun(*args, env=None, timeout=60, **kw):
    e = dict(os.environ, PYTHON_EXEC=PY, **(env or {}))
    return subprocess.run([DDPRUN, *args], capture_output=True, text=True, timeout=timeout,
                          env=e, **kw)


def gone(pid):
    """True once pid no longer runs (absent, or a zombie waiting for a late reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def wait_gone(pids, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.01)
    return [p for p in pids if not gone(p)]


def kill_leftovers(pids):
    for p in pids:
        if not gone(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_for(path, limit=30):
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.01)


def on_tmpfs(path, size, cmd, inodes=4096, required=False):
    """cmd run with a tmpfs of `size` bytes and `inodes` inodes mounted on `path`, in a private
    mount namespace of its own; where mounting is not allowed, under RLIMIT_FSIZE = size
    instead (ddprun then gets EFBIG, not SIGXFSZ), or a skip when `required`. Returns (argv,
    preexec_fn)."""
    mount = f"mount -t tmpfs -o size={size},nr_inodes={inodes} tmpfs {path}"
    try:
        probe = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", mount],
                               capture_output=True, timeout=30).returncode
    except OSError:  # no unshare here
        probe = 1
    if probe == 0:
        return (["unshare", "-m", "--propagation", "private", "sh", "-c",
                 f'{mount} && exec "$@"', "sh", *cmd], None)
    if required:
        pytest.skip("cannot mount a tmpfs here (needs root and unshare -m)")
    return cmd, lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


@pytest.fixture
def workdir():
    d = tempfile.mkdtemp(prefix="ddp-hostile-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


# Item 1a: every count a user gives has a bound; exit 2 names the flag, nothing is created.

def test_absurd_worker_count_is_refused_at_once(workdir):
    start = time.monotonic()
    cmd, preexec = on_tmpfs(workdir, 8 << 20, [DDPRUN, "--standalone",
                                               "--nproc-per-node=10000000", "--no-python",
                                               "/bin/true"])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, preexec_fn=preexec,
                       env=dict(os.environ, TMPDIR=workdir))
    assert p.returncode == 2, p.stderr
    assert "--nproc-per-node=10000000" in p.stderr
    assert time.monotonic() - start < 10
    assert os.listdir(workdir) == []  # no torchelastic_* directory, no per-rank anything


@pytest.mark.parametrize("args, flag", [
    (["--nproc-per-node=5000"], "--max-nproc-per-node"),  # above the default bound
    (["--max-nproc-per-node=100000000", "--nproc-per-node=2"], "--max-nproc-per-node"),
    (["--nnodes=1:1000000"], "--nnodes"),
    (["--max-restarts=1000000000"], "--max-restarts"),
    (["--local-ranks-filter=0,99999999"], "--local-ranks-filter"),
    (["--tee=0:3,99999999:1"], "--tee"),
    (["--redirects=99999999:1"], "--redirects"),
    (["--rdzv-conf=join_timeout=1e308"], "join_timeout"),
    (["--rdzv-conf=keep_alive_max_attempt=99999999"], "keep_alive_max_attempt"),
])
def test_count_bounds_name_the_flag(workdir, args, flag):
    cmd, preexec = on_tmpfs(workdir, 8 << 20,
                            [DDPRUN, "--standalone", *args, "--no-python", "/bin/true"])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30, preexec_fn=preexec,
                       env=dict(os.environ, TMPDIR=workdir))
    assert p.returncode == 2, p.stderr
    assert flag in p.stderr
    assert os.listdir(workdir) == []


# Items 1b and 1c: SIGTERM while workers are being spawned stops the spawning at once; only the
# ranks that started got a log directory; no worker is left.

def test_sigterm_during_spawning(workdir):
    nproc = 1000
    logs = os.path.join(workdir, "logs")
    pids = os.path.join(workdir, "pids")
    dirs = os.path.join(workdir, "rank_dirs_seen_by_rank_0")
    os.mkdir(pids)
    os.mkdir(logs)
    cmd, preexec = on_tmpfs(logs, 8 << 20, [
        DDPRUN, "--standalone", f"--nproc-per-node={nproc}", f"--log-dir={logs}", "--tee=3",
        "--no-python", "/bin/sh", "-c",
        f'[ $LOCAL_RANK = 0 ] && ls $(dirname $TORCHELASTIC_ERROR_FILE)/.. | wc -l > {dirs}.tmp'
        f' && mv {dirs}.tmp {dirs};'
        f' echo $$ > {pids}/$LOCAL_RANK.tmp && mv {pids}/$LOCAL_RANK.tmp {pids}/$LOCAL_RANK;'
        ' exec sleep 1000'])
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=preexec)
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(dirs):  # rank 0 runs: the spawning is under way
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.002)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
        print(f"exit {took:.3f} s after SIGTERM; {len(os.listdir(pids))} workers had started")
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert took < 5, err
        # rank directories are made as ranks are spawned, not all before the first
        assert 0 < int(open(dirs).read()) < nproc
        started = [int(open(os.path.join(pids, f)).read()) for f in os.listdir(pids)
                   if not f.endswith(".tmp")]
        assert len(started) < nproc  # the spawning stopped
        assert wait_gone(started, 2) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_leftovers([int(open(os.path.join(pids, f)).read()) for f in os.listdir(pids)
                        if not f.endswith(".tmp")])


# Item 1d: a full disk under --log-dir costs the file, not the job: one warning, exit 0.

PRINT_2MIB = "import sys\nfor i in range(2048):\n    print(f'{i:05d} ' + 'x' * 1018)\n"


def run_on_small_disk(logs, args, timeout=60):
    os.makedirs(logs)
    cmd, preexec = on_tmpfs(logs, 1 << 20, [DDPRUN, f"--log-dir={logs}", *args])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, PYTHON_EXEC=PY), preexec_fn=preexec)


@pytest.mark.parametrize("mode", ["--tee=3", "--redirects=3"])
def test_full_log_disk_is_reported_once_and_the_job_goes_on(workdir, mode):
    script = os.path.join(workdir, "print.py")
    with open(script, "w") as f:
        f.write(PRINT_2MIB)
    p = run_on_small_disk(os.path.join(workdir, "logs"),
                          ["--standalone", mode, "--no-python", PY, script])
    assert p.returncode == 0, p.stderr[-2000:]
    warnings = [l for l in p.stderr.splitlines() if "cannot write the log file" in l]
    assert len(warnings) == 1, p.stderr[-2000:]
    assert "stdout.log" in warnings[0]
    assert "No space left on device" in warnings[0] or "File too large" in warnings[0]
    if mode == "--tee=3":  # the console still gets every line
        lines = p.stdout.splitlines()
        assert len(lines) == 2048 and lines[-1].startswith("[default0]:02047 ")


def test_a_log_file_that_cannot_be_created_stops_the_job_cleanly(workdir):
    logs = os.path.join(workdir, "logs")
    pids = os.path.join(workdir, "pids")
    os.makedirs(logs)
    os.mkdir(pids)
    # 12 inodes: the root, the run and attempt directories, then a few ranks' dirs and files
    cmd, preexec = on_tmpfs(logs, 1 << 20, [
        DDPRUN, "--standalone", "--nproc-per-node=8", f"--log-dir={logs}", "--tee=3",
        "--no-python", "/bin/sh", "-c", f"echo $$ > {pids}/$LOCAL_RANK; exec sleep 1000"],
        inodes=12, required=True)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, preexec_fn=preexec)
    started = [int(open(os.path.join(pids, f)).read() or 0) for f in os.listdir(pids)]
    try:
        assert p.returncode == 1, p.stderr
        assert "cannot create the log" in p.stderr and "stopping the job" in p.stderr
        assert 0 < len(started) < 8
        assert wait_gone([x for x in started if x], 2) == []
    finally:
        kill_leftovers([x for x in started if x])


# Item 5: a worker inherits fds 0, 1, 2 and what ddprun itself inherited; nothing of the agent's
# but its own progress pipe (DDPRUN_PROGRESS_FD, docs/hangs.md), which is left out of the list.

LIST_FDS = textwrap.dedent("""
    import os, sys
    names = os.listdir("/proc/self/fd")
    # the listing's own directory fd is closed by now: keep the fds still open
    fds = sorted(int(n) for n in names if os.path.exists(f"/proc/self/fd/{n}"))
    progress = int(os.environ.get("DDPRUN_PROGRESS_FD", "-1"))
    assert progress in fds, (progress, fds)  # the worker's own progress pipe, open
    assert os.readlink(f"/proc/self/fd/{progress}").startswith("pipe:")
    fds.remove(progress)
    control = int(os.environ.get("DDPRUN_CONTROL_FD", "-1"))
    assert control in fds, (control, fds)  # the agent's control pipe to it, open for reading
    assert os.readlink(f"/proc/self/fd/{control}").startswith("pipe:")
    fds.remove(control)
    print("fds", " ".join(map(str, fds)), flush=True)
    if len(sys.argv) > 1:
        os.write(int(sys.argv[1]), f"hello from {os.environ['LOCAL_RANK']}\\n".encode())
""")


def test_workers_inherit_only_stdio(workdir):
    p = ddprun("--standalone", "--nproc-per-node=2", "--no-python", PY, "-c", LIST_FDS)
    assert p.returncode == 0, p.stderr
    assert sorted(l.split(":", 1)[1] for l in p.stdout.splitlines()) == ["fds 0 1 2"] * 2


def test_workers_also_inherit_the_fds_ddprun_was_given(workdir):
    r, w = os.pipe()
    passed = w
    try:
        p = ddprun("--standalone", "--nproc-per-node=2", "--no-python", PY, "-c", LIST_FDS,
                   str(passed), pass_fds=(passed,))
        os.close(w)
        w = -1
        assert p.returncode == 0, p.stderr
        assert sorted(l.split(":", 1)[1] for l in p.stdout.splitlines()) == \
            [f"fds 0 1 2 {passed}"] * 2
        with os.fdopen(r, "r") as f:
            r = -1
            assert sorted(f.read().splitlines()) == ["hello from 0", "hello from 1"]
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)


# Item 7: 1 MiB lines of two ranks reach the console whole and never interleave.

def test_long_lines_never_interleave():
    code = ("import os, sys\n"
            "c = 'ab'[int(os.environ['LOCAL_RANK'])]\n"
            "for _ in range(4):\n"
            "    sys.stdout.write(c * (1 << 20) + '\\n')\n"
            "    sys.stdout.flush()\n")
    p = ddprun("--standalone", "--nproc-per-node=2", "--no-python", PY, "-c", code, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split("\n")
    assert lines[-1] == ""
    lines = lines[:-1]
    assert len(lines) == 8
    for line in lines:
        prefix, text = line[:11], line[11:]
        assert prefix in ("[default0]:", "[default1]:"), line[:40]
        assert text == "ab"[int(prefix[8])] * (1 << 20), (prefix, len(text), set(text))


# Item 6: nothing a worker starts outlives the agent, at any depth, after SIGTERM or SIGKILL.

SHAPES = textwrap.dedent("""
    import os, sys, time
    mode, out = sys.argv[1], sys.argv[2]
    def sleeper():
        os.execvp("sleep", ["sleep", "1000"])
    if mode == "child":        # a child that stays the worker's
        pid = os.fork()
        if pid == 0:
            sleeper()
    elif mode == "double":     # a double fork: the middle process exits at once
        r, w = os.pipe()
        mid = os.fork()
        if mid == 0:
            os.close(r)
            pid = os.fork()
            if pid == 0:
                os.close(w)
                sleeper()
            os.write(w, str(pid).encode())
            os._exit(0)
        os.close(w)
        pid = int(os.read(r, 64))
        os.waitpid(mid, 0)
    else:                      # a setsid'ed daemon, in its own session and process group
        pid = os.fork()
        if pid == 0:
            os.setsid()
            sleeper()
    with open(out + ".tmp", "w") as f:
        f.write(str(pid))
    os.rename(out + ".tmp", out)
    time.sleep(1000)
""")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("shape", ["child", "double", "setsid"])
def test_no_descendant_outlives_the_agent(workdir, shape, sig):
    script = os.path.join(workdir, "shapes.py")
    with open(script, "w") as f:
        f.write(SHAPES)
    out = os.path.join(workdir, "pid")
    proc = subprocess.Popen([DDPRUN, "--standalone", "--no-python", PY, script, shape, out],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    pid = None
    try:
        wait_for(out)
        pid = int(open(out).read())
        assert not gone(pid)
        time.sleep(0.3)  # older than the watcher's last snapshot (every ~50 ms)
        sent = time.monotonic()
        proc.send_signal(sig)
        proc.wait(timeout=30)
        left = wait_gone([pid], 2)
        print(f"{shape}/{sig.name}: gone {time.monotonic() - sent:.3f} s after the signal")
        assert left == [], f"{shape} grandchild {pid} outlived the agent's {sig.name}"
        if sig == signal.SIGTERM:
            assert proc.returncode == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid:
            kill_leftovers([pid])
