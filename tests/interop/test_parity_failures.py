"""Failures, side by side with torch 2.15's torchrun (the test venv's `torchrun` command):

- a worker that SIGKILLs itself: the failure summary reads as torchrun's, line for line
  (`exitcode  : -9 (pid: N)  (SIGKILL)`, `Signal 9 (SIGKILL) received by PID N`), but for
  the time, pid and host values;
- ddprun run with TORCHELASTIC_ERROR_FILE set (as a scheduler or a parent launcher does):
  a worker raising under @record leaves the same JSON there as torchrun leaves; a signal death,
  where torchrun writes nothing, leaves torch's shape with errorCode -9;
- --run-path: the script sees torchrun's sys.path[0] and sys.argv, and a raise leaves its
  error file and its traceback in the summary, as under torchrun;
- a worker killed by the kernel's OOM killer (ddprun in a memory cgroup of 200 MB, v2 or v1)
  is named as such in the summary and in ddprun's error file; skipped, saying why, where this
  machine lets no memory cgroup be made.
Each run is bounded by a timeout; torchrun is the reference."""
import glob
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import BIN

DDPRUN = os.path.join(BIN, "ddprun")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
TIMEOUT = 60

KILL9 = "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"

RAISE_RECORDED = textwrap.dedent("""
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main():
        raise ValueError("boom from worker")

    main()
""")

RUN_PATH_SCRIPT = textwrap.dedent("""
    import json, os, sys
    with open(os.environ["OUT"], "w") as f:
        json.dump({"path0": sys.path[0], "argv": sys.argv, "name": __name__}, f)
    raise RuntimeError("boom in a run-path script")
""")

# Allocates 10 MB at a time, touching every page, up to 4 GB: far past a 200 MB cgroup.
HOG = textwrap.dedent("""
    import sys
    hog = []
    for _ in range(400):
        hog.append(b"x" * 10**7)
    print("not killed", flush=True)
    sys.exit(3)
""")


def launchers():
    for path in (DDPRUN, TORCHRUN):
        if not os.path.exists(path):
            pytest.fail(f"{path} not found: build ddprun first (DDP_BIN_DIR), run the tests "
                        "with the test venv's python")


def run(cmd, tmp_path, script_text, *args, env_extra=None, flags=(), preexec_fn=None,
        absolute=False):
    """Runs `cmd --standalone --nproc-per-node=1 [flags] script.py args` in tmp_path (the
    script's path is relative, so both summaries have the same title, unless `absolute`)."""
    (tmp_path / "script.py").write_text(script_text)
    script = tmp_path / "script.py" if absolute else "script.py"
    env = dict(os.environ)
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    env.pop("PYTHON_EXEC", None)
    if cmd == DDPRUN:  # torchrun runs its own interpreter (set, it would title the summary)
        env["PYTHON_EXEC"] = sys.executable
    env.update(env_extra or {})
    return subprocess.run([cmd, "--standalone", "--nproc-per-node=1", *flags, str(script), *args],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=tmp_path,
                          preexec_fn=preexec_fn)


def summary(stderr):
    """The failure summary block: from the first rule line of '=' to the last."""
    lines = stderr.splitlines()
    rules = [i for i, line in enumerate(lines) if re.fullmatch(r"=+", line)]
    assert len(rules) >= 2, f"no failure summary in:\n{stderr}"
    return lines[rules[0]:rules[-1] + 1]


def field(block, name):
    prefix = f"  {name:<10}: "
    found = [line[len(prefix):] for line in block if line.startswith(prefix)]
    assert found, f"no {name!r} line in:\n" + "\n".join(block)
    return found[-1]  # the root cause comes last


def normalized(block):
    """The block with the values that differ per run or per launcher replaced."""
    pid = re.match(r"-?\d+ \(pid: (\d+)\)", field(block, "exitcode")).group(1)
    out = []
    for line in block:
        if re.fullmatch(r"=+", line):
            line = "<rule =>"
        elif re.fullmatch(r"-+", line):
            line = "<rule ->"
        line = re.sub(r"^  time      : .*", "  time      : <time>", line)
        line = re.sub(r"^  host      : .*", "  host      : <host>", line)
        out.append(line.replace(pid, "<pid>"))
    return out


@pytest.fixture(scope="module")
def sigkill_runs(tmp_path_factory):
    launchers()
    runs = {}
    for name, cmd in (("torchrun", TORCHRUN), ("ddprun", DDPRUN)):
        tmp = tmp_path_factory.mktemp("sigkill-" + name)
        runs[name] = run(cmd, tmp, KILL9, env_extra={"TORCHELASTIC_ERROR_FILE":
                                                    str(tmp / "launcher_error.json")})
        runs[name + "_error_file"] = tmp / "launcher_error.json"
    return runs


def test_signal_death_summary_reads_as_torchruns(sigkill_runs):
    t = summary(sigkill_runs["torchrun"].stderr)
    d = summary(sigkill_runs["ddprun"].stderr)
    assert re.fullmatch(r"-9 \(pid: \d+\)  \(SIGKILL\)", field(t, "exitcode")), t
    assert re.fullmatch(r"-9 \(pid: \d+\)  \(SIGKILL\)", field(d, "exitcode")), d
    assert field(d, "rank") == field(t, "rank") == "0 (local_rank: 0)"
    # torchrun names the host by socket.getfqdn(), ddprun by gethostname() (docs/decisions.md)
    assert field(t, "host") == socket.getfqdn()
    assert field(d, "host") == socket.gethostname()
    # ddprun may add what the OOM-kill counters say after torchrun's text, never instead of it.
    traceback = field(d, "traceback")
    assert re.fullmatch(r"Signal 9 \(SIGKILL\) received by PID \d+(; .*out of memory.*)?",
                        traceback), traceback
    d = [line.split("; ")[0] if line.startswith("  traceback : ") else line for line in d]
    assert normalized(d) == normalized(t), (
        "torchrun:\n" + "\n".join(t) + "\nddprun:\n" + "\n".join(d))
    assert sigkill_runs["torchrun"].returncode == 1
    assert sigkill_runs["ddprun"].returncode == 128 + 9  # ddprun's exit code carries the signal


def test_signal_death_leaves_ddpruns_error_file(sigkill_runs):
    """torchrun leaves no error file when the worker wrote none; ddprun writes torch's shape."""
    data = json.loads(sigkill_runs["ddprun_error_file"].read_text())
    msg = data["message"]
    assert re.match(r"Signal 9 \(SIGKILL\) received by PID \d+", msg["message"]), msg
    assert msg["errorCode"] == -9
    assert msg["extraInfo"]["timestamp"].isdigit()
    assert "FAILED" in msg["extraInfo"]["py_callstack"]


def test_recorded_error_reaches_the_launchers_error_file(tmp_path):
    launchers()
    files = {}
    for name, cmd in (("torchrun", TORCHRUN), ("ddprun", DDPRUN)):
        tmp = tmp_path / name
        tmp.mkdir()
        path = tmp / "launcher_error.json"
        p = run(cmd, tmp, RAISE_RECORDED, env_extra={"TORCHELASTIC_ERROR_FILE": str(path)})
        assert p.returncode == 1, f"{name} exited {p.returncode}:\n{p.stderr}"
        assert path.exists(), f"{name} wrote no error file:\n{p.stderr}"
        files[name] = json.loads(path.read_text())
    t, d = files["torchrun"], files["ddprun"]
    assert d.keys() == t.keys() == {"message"}
    assert d["message"].keys() == t["message"].keys() == {"message", "extraInfo", "errorCode"}
    assert d["message"]["extraInfo"].keys() == t["message"]["extraInfo"].keys()
    assert d["message"]["message"] == t["message"]["message"] == "ValueError: boom from worker"
    assert d["message"]["errorCode"] == t["message"]["errorCode"] == 1
    for f in (t, d):
        assert f["message"]["extraInfo"]["timestamp"].isdigit()
        assert f["message"]["extraInfo"]["py_callstack"].endswith(
            "ValueError: boom from worker\n")


def test_run_path_runs_as_under_torchrun(tmp_path):
    launchers()
    seen, blocks = {}, {}
    for name, cmd in (("torchrun", TORCHRUN), ("ddprun", DDPRUN)):
        tmp = tmp_path / name
        tmp.mkdir()
        out = tmp / "seen.json"
        p = run(cmd, tmp, RUN_PATH_SCRIPT, "a1", "--b=2", env_extra={"OUT": str(out)},
                flags=("--run-path", "--log-dir", str(tmp / "logs")), absolute=True)
        assert p.returncode == 1, f"{name} exited {p.returncode}:\n{p.stderr}"
        seen[name] = json.loads(out.read_text())
        blocks[name] = summary(p.stderr)
        error_files = glob.glob(str(tmp / "logs" / "*" / "attempt_0" / "0" / "error.json"))
        assert len(error_files) == 1, f"{name}: error files {error_files}"
        assert field(blocks[name], "error_file") == error_files[0]
        err = json.loads(open(error_files[0]).read())["message"]
        assert err["message"] == "RuntimeError: boom in a run-path script"
        assert err["extraInfo"]["timestamp"].isdigit()
        assert f'File "{tmp / "script.py"}", line 5, in <module>' in err["extraInfo"]["py_callstack"]
    # sys.path[0] is torchrun's own: the folder of the `torchrun` command (the venv's bin),
    # not the script's.
    assert seen["ddprun"]["path0"] == seen["torchrun"]["path0"] == os.path.dirname(TORCHRUN)
    assert seen["ddprun"]["name"] == seen["torchrun"]["name"] == "__main__"
    for name in seen:  # the script's own path, as given, then its arguments
        assert seen[name]["argv"] == [str(tmp_path / name / "script.py"), "a1", "--b=2"]
    for name, block in blocks.items():
        text = "\n".join(block)
        assert "  traceback : Traceback (most recent call last):\n" in text, text
        assert '\n      raise RuntimeError("boom in a run-path script")\n' in text, text
        assert "\n  RuntimeError: boom in a run-path script\n" in text, text


# --- OOM ------------------------------------------------------------------------------------

def _mounts():
    """{"cgroup2": (mount, root), "memory": (mount, root)} from /proc/self/mountinfo."""
    found = {}
    for line in open("/proc/self/mountinfo"):
        head, _, tail = line.partition(" - ")
        h, t = head.split(), tail.split()
        if len(h) < 5 or len(t) < 3:
            continue
        if t[0] == "cgroup2":
            found.setdefault("cgroup2", (h[4], h[3]))
        elif t[0] == "cgroup" and "memory" in t[2].split(","):
            found.setdefault("memory", (h[4], h[3]))
    return found


def _own_cgroups():
    v2 = v1 = None
    for line in open("/proc/self/cgroup"):
        ident, controllers, path = line.rstrip("\n").split(":", 2)
        if ident == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    return v2, v1


def _below(mount, root, path):
    if root == "/":
        return mount + (path if path != "/" else "")
    if path == root or path.startswith(root + "/"):
        return mount + path[len(root):]
    return None


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def remove_cgroup(d, undo):
    """rmdir once its processes are gone (a killed one may take a moment), then `undo`."""
    deadline = time.monotonic() + 10
    while True:
        try:
            os.rmdir(d)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    for path, text in undo:
        try:
            _write(path, text)
        except OSError:
            pass  # another cgroup uses the controller now: leave it on


def make_memory_cgroup(limit):
    """A fresh memory cgroup with `limit` bytes and no swap: (dir, procs file, undo). Tries
    cgroup v2 below the visible root (enabling the memory controller there, undone after),
    then v1 below this process's memory cgroup. Raises OSError or RuntimeError saying why
    it cannot."""
    mounts, (v2, v1) = _mounts(), _own_cgroups()
    name = f"ddprun-oom-test-{os.getpid()}"
    reasons = []
    if "cgroup2" in mounts:
        mount, _ = mounts["cgroup2"]
        d = os.path.join(mount, name)
        try:
            controllers = open(os.path.join(mount, "cgroup.controllers")).read().split()
            if "memory" not in controllers:
                raise RuntimeError(f"{mount} has no memory controller (v2)")
            subtree = os.path.join(mount, "cgroup.subtree_control")
            undo = []
            if "memory" not in open(subtree).read().split():
                _write(subtree, "+memory")
                undo.append((subtree, "-memory"))
            os.mkdir(d)
            try:
                _write(os.path.join(d, "memory.max"), str(limit))
                if os.path.exists(os.path.join(d, "memory.swap.max")):
                    _write(os.path.join(d, "memory.swap.max"), "0")
            except OSError:
                remove_cgroup(d, undo)
                raise
            return d, os.path.join(d, "cgroup.procs"), undo
        except (OSError, RuntimeError) as e:
            reasons.append(f"cgroup v2: {e}")
    if "memory" in mounts and v1:
        parent = _below(*mounts["memory"], v1)
        d = os.path.join(parent, name) if parent else None
        try:
            if d is None:
                raise RuntimeError(f"memory cgroup {v1} is outside the visible mount")
            os.mkdir(d)
            try:
                _write(os.path.join(d, "memory.limit_in_bytes"), str(limit))
                if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes")):
                    _write(os.path.join(d, "memory.memsw.limit_in_bytes"), str(limit))
            except OSError:
                remove_cgroup(d, [])
                raise
            return d, os.path.join(d, "cgroup.procs"), []
        except (OSError, RuntimeError) as e:
            reasons.append(f"cgroup v1: {e}")
    raise RuntimeError("; ".join(reasons) or "no cgroup v2 or v1 memory hierarchy is mounted")


def test_oom_killed_worker_is_named(tmp_path):
    launchers()
    try:
        cgroup, procs, undo = make_memory_cgroup(200 * 1024 * 1024)
    except (OSError, RuntimeError) as e:
        pytest.skip(f"cannot make a memory-limited cgroup here: {e}")
    try:
        error_file = tmp_path / "launcher_error.json"
        p = run(DDPRUN, tmp_path, HOG, env_extra={"TORCHELASTIC_ERROR_FILE": str(error_file)},
                preexec_fn=lambda: _write(procs, str(os.getpid())))
    finally:
        remove_cgroup(cgroup, undo)
    assert "not killed" not in p.stdout + p.stderr, "the worker outgrew the cgroup's limit"
    assert p.returncode == 128 + 9, p.stderr
    block = summary(p.stderr)
    assert re.fullmatch(r"-9 \(pid: \d+\)  \(SIGKILL\)", field(block, "exitcode")), block
    traceback = field(block, "traceback")
    assert re.match(r"Signal 9 \(SIGKILL\) received by PID \d+; killed by the kernel's OOM killer "
                    r"\(out of memory\): oom_kill in .*" + re.escape(os.path.basename(cgroup)),
                    traceback), traceback
    msg = json.loads(error_file.read_text())["message"]
    assert "killed by the kernel's OOM killer (out of memory)" in msg["message"], msg
    assert msg["errorCode"] == -9
