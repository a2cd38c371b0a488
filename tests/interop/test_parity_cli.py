"""ddprun's command line against the installed torchrun's (torch 2.15 in the test venv), side by
side: every option `torchrun --help` lists is accepted by ddprun (so the next torch release
breaks this test, not a user), and the flags torch 2.12-2.15 added mean what they mean under
torchrun: --standalone ignores the rendezvous flags, --logs-specs is not silently ignored,
--shutdown-timeout bounds the stop, --virtual-local-rank narrows the GPUs, the duplicate
filters fill filtered_std*.log, PYTHON_EXEC picks the interpreter, --print-completion prints a
working script."""
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import BIN

DDPRUN = os.path.join(BIN, "ddprun")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

# A value ddprun can run with, per option dest; an option not named here (a new torchrun flag)
# is tried with "1", and the test only fails if ddprun does not know the option at all.
VALUES = {"nnodes": "1", "nproc_per_node": "1", "rdzv_backend": "c10d",
          "rdzv_endpoint": "localhost:0", "rdzv_id": "x", "rdzv_conf": "join_timeout=30",
          "max_restarts": "0", "monitor_interval": "0.1", "event_log_handler": "null",
          "role": "r", "redirects": "0", "tee": "0", "log_line_prefix_template": "[x]",
          "local_ranks_filter": "0", "duplicate_stdout_filters": "a",
          "duplicate_stderr_filters": "a", "node_rank": "0", "master_addr": "127.0.0.1",
          "master_port": "29500", "local_addr": "127.0.0.1", "logs_specs": "nosuch",
          "signals_to_handle": "SIGTERM", "shutdown_timeout": "5", "log_dir": None}


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "SLURM_", "TORCHELASTIC_"))}
    env.pop("OMP_NUM_THREADS", None)
    env.update(extra)
    return env


def torchrun_options():
    """[(option string, dest, metavar or None)] from the venv's `torchrun --help`."""
    text = subprocess.run([*TORCHRUN, "--help"], capture_output=True, text=True, timeout=120,
                          env=clean_env()).stdout
    section = text.split("options:", 1)[1]
    found = []
    for line in section.splitlines():
        if not re.match(r"^  -", line):
            continue
        head = re.split(r"\s{2,}", line.strip())[0]
        for part in head.split(", "):
            bits = part.split(" ", 1)
            found.append((bits[0], bits[0].lstrip("-").replace("-", "_"),
                          bits[1] if len(bits) > 1 else None))
    assert len(found) > 40, text  # both spellings of ~34 flags: the parse worked
    return found


def test_every_torchrun_option_is_accepted(tmp_path):
    problems = []
    dests = {}
    for opt, dest, metavar in torchrun_options():
        if opt in ("-h", "--help"):
            continue
        # -r/-t/-m: the dest is the long name's
        dest = {"r": "redirects", "t": "tee", "m": "module"}.get(dest, dest)
        dests.setdefault(dest, []).append(opt)
        argv = [DDPRUN, opt]
        if metavar is not None:
            choices = re.match(r"^\{([^}]*)\}$", metavar)
            value = choices.group(1).split(",")[0] if choices else VALUES.get(dest, "1")
            if dest == "log_dir":
                value = str(tmp_path / "logs")
            argv.append(value)
        if dest != "standalone":
            argv.append("--standalone")  # one node on its own; it ignores the rdzv flags
        if dest == "module":
            argv.append("ok")
        elif dest == "run_path":
            argv.append(str(tmp_path / "ok.py"))
        else:
            argv += ["--no-python", "/bin/true"]
        (tmp_path / "ok.py").write_text("pass\n")
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           env=clean_env(PYTHON_EXEC=sys.executable))
        unknown = re.search(r"unknown option|not expected|was not expected|unrecognized",
                            p.stderr, re.I)
        if dest == "logs_specs":  # a Python plugin: an error naming it, as torchrun's
            ok = p.returncode != 0 and "torchrun.logs_specs[nosuch]" in p.stderr
        else:
            ok = p.returncode == 0 and not unknown
        if not ok:
            problems.append(f"{' '.join(argv[1:3])}: exit {p.returncode}: {p.stderr[-400:]}")
    assert not problems, "\n".join(problems)
    # the parse found the flags this issue is about
    for dest in ("virtual_local_rank", "shutdown_timeout", "duplicate_stdout_filters",
                 "duplicate_stderr_filters", "print_completion", "numa_binding"):
        assert dest in dests, sorted(dests)


def both(args, script_args=(), env=None, timeout=60):
    """Runs the same command line under torchrun and ddprun; returns both results."""
    out = []
    for cmd in (TORCHRUN, [DDPRUN]):
        out.append(subprocess.run([*cmd, *args, *script_args], capture_output=True, text=True,
                                  timeout=timeout, env=clean_env(**(env or {}))))
    return out


def test_standalone_ignores_rendezvous_flags_as_torchrun():
    t, d = both(["--standalone", "--rdzv-backend=etcd-v2", "--rdzv-endpoint=nowhere:1",
                 "--rdzv-id=mine", "--nproc-per-node=1", "--no-python", "/bin/true"])
    assert t.returncode == 0, t.stderr
    assert d.returncode == 0, d.stderr


def test_logs_specs_is_an_error_under_both():
    t, d = both(["--logs-specs=nosuch", "--standalone", "--no-python", "/bin/true"])
    want = "Could not find entrypoint under 'torchrun.logs_specs[nosuch]' key"
    assert t.returncode != 0 and want in t.stderr, t.stderr
    assert d.returncode == 2 and want in d.stderr, d.stderr


def test_python_exec_picks_the_interpreter(tmp_path):
    marker = tmp_path / "marker"
    wrapper = tmp_path / "py"
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\nexec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    t, d = both(["--standalone", "--nproc-per-node=1", str(script)],
                env={"PYTHON_EXEC": str(wrapper)})
    assert t.returncode == 0 and d.returncode == 0, (t.stderr, d.stderr)
    lines = marker.read_text().splitlines()
    assert lines == [f"-u {script}", f"-u {script}"], lines


def test_shutdown_timeout_bounds_the_stop(tmp_path):
    """A worker that ignores SIGTERM: with --shutdown-timeout=1 both launchers SIGKILL it soon
    after their own SIGTERM (the default, 30 s, would outlast this test's bound)."""
    script = tmp_path / "stubborn.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(os.path.join({str(tmp_path)!r}, "ready." + os.environ["LOCAL_RANK"]), "w").close()
        time.sleep(300)
    """))
    for name, cmd in (("torchrun", TORCHRUN), ("ddprun", [DDPRUN])):
        for f in tmp_path.glob("ready.*"):
            f.unlink()
        p = subprocess.Popen([*cmd, "--standalone", "--nproc-per-node=1", "--shutdown-timeout=1",
                              str(script)], env=clean_env(PYTHON_EXEC=sys.executable),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not (tmp_path / "ready.0").exists():
                assert p.poll() is None and time.monotonic() < deadline, name
                time.sleep(0.05)
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=20)  # 30 s default: a launcher ignoring the flag fails here
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        assert p.returncode != 0, name


def test_virtual_local_rank_under_both(tmp_path):
    script = tmp_path / "dump.py"
    script.write_text(textwrap.dedent(f"""
        import os
        with open(os.path.join({str(tmp_path)!r}, os.environ["RANK"] + "." + os.environ["L"]),
                  "w") as f:
            f.write(os.environ["LOCAL_RANK"] + " " + os.environ.get("CUDA_VISIBLE_DEVICES", "-"))
    """))
    seen = {}
    for name, cmd in (("torchrun", TORCHRUN), ("ddprun", [DDPRUN])):
        p = subprocess.run([*cmd, "--standalone", "--nproc-per-node=2", "--virtual-local-rank",
                            str(script)], capture_output=True, text=True, timeout=60,
                           env=clean_env(PYTHON_EXEC=sys.executable, L=name,
                                         CUDA_VISIBLE_DEVICES="3,5"))
        assert p.returncode == 0, (name, p.stderr)
        seen[name] = [(tmp_path / f"{r}.{name}").read_text() for r in range(2)]
    assert seen["torchrun"] == ["0 3", "0 5"], seen
    assert seen["ddprun"] == seen["torchrun"]


def filtered_lines(log_dir, stream):
    found = [os.path.join(root, f"filtered_{stream}.log") for root, _, files in os.walk(log_dir)
             if f"filtered_{stream}.log" in files]
    assert len(found) == 1, found
    return sorted(open(found[0]).read().splitlines())


def test_duplicate_filters_under_both(tmp_path):
    script = tmp_path / "talk.py"
    script.write_text(textwrap.dedent("""
        import sys
        for i in range(3):
            print(f"loss {i} apple", flush=True)
            print(f"noise {i}", flush=True)
            print(f"grad, {i} orange", file=sys.stderr, flush=True)
    """))
    got = {}
    for name, cmd in (("torchrun", TORCHRUN), ("ddprun", [DDPRUN])):
        logs = tmp_path / name
        p = subprocess.run([*cmd, "--standalone", "--nproc-per-node=2", "--tee=3",
                            f"--log-dir={logs}", "--duplicate-stdout-filters=apple,pear",
                            "--duplicate-stderr-filters=grad,, ", str(script)],
                           capture_output=True, text=True, timeout=60,
                           env=clean_env(PYTHON_EXEC=sys.executable))
        assert p.returncode == 0, (name, p.stderr)
        got[name] = (filtered_lines(logs, "stdout"), filtered_lines(logs, "stderr"))
    out, err = got["torchrun"]
    assert len(out) == 6 and all("apple" in line for line in out), out
    assert len(err) == 6 and all("grad, " in line for line in err), err
    assert got["ddprun"] == got["torchrun"]


def test_print_completion_bash_completes_ddprun_flags(tmp_path):
    p = subprocess.run([DDPRUN, "--print-completion", "bash"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr
    script = tmp_path / "ddprun.bash"
    script.write_text(p.stdout)
    probe = (f"source {script}; COMP_WORDS=(ddprun --nproc-p); COMP_CWORD=1; _ddprun; "
             "echo \"${COMPREPLY[@]}\"; COMP_WORDS=(ddprun --numa-binding ''); COMP_CWORD=2; "
             "_ddprun; echo \"${COMPREPLY[@]}\"")
    r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 2, (r.stdout, r.stderr)
    assert lines[0].split() == ["--nproc-per-node"]
    assert lines[1].split() == ["node", "socket", "exclusive", "core-complex"]
    bad = subprocess.run([DDPRUN, "--print-completion", "fish"], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 2 and "--print-completion" in bad.stderr
