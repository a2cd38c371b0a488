"""The wheel (issue 33): built by scikit-build-core from the CMake project and repaired by
auditwheel (scripts/build_packages.sh), installed into a fresh venv, and run from it without
activating it: the version, `python -m ddprun`, a single-node ddp-train job, ddprund with two
agents, a torch 2.x DDP script (the torch venv's python as PYTHON_EXEC), the workers' python
(the venv's own), and `python -m ddprun.launch`. Then the same programs in a minimal Debian 12
root (debootstrap: the base system and python3, no -dev package) with only the wheel's files."""
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
import zipfile

from conftest import DEBROOT, TORCH_PYTHON, bare_env, missing_tool, project_version

TRAIN = ["1", "0", "--model", "linear", "--dataset", "synthetic", "--synthetic-size", "256",
         "--threads", "1", "--no-eval"]

DDP_SCRIPT = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 1))
m(torch.ones(1, 2)).sum().backward()
open(os.path.join(os.environ["OUT"], os.environ["RANK"]), "w").write(str(t.item()))
dist.destroy_process_group()
os._exit(0)  # not torch's exit: its gloo teardown can abort (docs/testing.md)
"""


def run(argv, timeout=120, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)


def test_the_wheel_is_one_for_every_python_and_self_contained(wheel):
    name = os.path.basename(wheel)
    assert re.match(rf"ddprun-{project_version()}-py3-none-manylinux_2_\d+_x86_64\.whl$", name)
    auditwheel = os.path.join(os.path.dirname(TORCH_PYTHON), "auditwheel")
    if not os.access(auditwheel, os.X_OK):
        missing_tool("auditwheel (scripts/setup.sh puts it in the torch venv)")
    p = run([auditwheel, "show", wheel])
    assert p.returncode == 0, p.stdout + p.stderr
    tag = re.search(r"manylinux_2_\d+_x86_64", name).group(0)
    assert f'consistent with the following platform tag: "{tag}"' in " ".join(p.stdout.split())
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    for prog in ("ddprun", "ddprund", "ddpstore", "ddp-train"):
        assert f"ddprun-{project_version()}.data/scripts/{prog}" in names
    assert not any(n.endswith("torchrun") for n in names)  # torch's wheel owns that name
    vendored = [n for n in names if n.startswith("ddprun.libs/")]
    for lib in ("libspdlog", "libcrypto", "libhwloc", "libgloo", "libopenblas"):
        assert any(lib in n for n in vendored), (lib, vendored)


def test_programs_run_from_a_fresh_venv(venv, tmp_path):
    v = str(venv / "bin")
    env = bare_env()  # the venv is not activated, and not on PATH
    for prog in ("ddprun", "ddprund", "ddpstore", "ddp-train"):
        p = run([f"{v}/{prog}", "--version"], env=env)
        assert p.returncode == 0 and p.stdout.strip() == \
            f"{prog} {project_version()} (wheel build)", (prog, p.stdout, p.stderr)
    p = run([f"{v}/python", "-m", "ddprun", "--version"], env=env)
    assert p.stdout.strip() == f"ddprun {project_version()} (wheel build)", p.stderr
    # The single-node ddp-train job, ddp-train found by its path.
    p = run([f"{v}/ddprun", "--standalone", "--nproc-per-node=2", "--no-python",
             f"{v}/ddp-train", *TRAIN, "--snapshot", str(tmp_path / "s.ddp")], env=env,
            cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "final state  succeeded" in p.stderr


def test_ddprund_and_two_agents_from_the_venv(venv, tmp_path):
    v = str(venv / "bin")
    env = bare_env(OUT=str(tmp_path))
    port_file = tmp_path / "port"
    d = subprocess.Popen([f"{v}/ddprund", "--port", "0", "--port-file", str(port_file),
                          "--http-port", "-1"], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            assert time.monotonic() < deadline and d.poll() is None, "ddprund did not start"
            time.sleep(0.05)
        port = port_file.read_text().strip()
        run_id = uuid.uuid4().hex
        argv = [f"{v}/ddprun", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}", "--no-python",
                "/bin/sh", "-c", 'echo "$RANK/$WORLD_SIZE" > "$OUT/rank-$RANK"']
        agents = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True) for _ in range(2)]
        for a in agents:
            _, err = a.communicate(timeout=120)
            assert a.returncode == 0, err
        assert sorted(f.read_text().strip() for f in tmp_path.glob("rank-*")) == ["0/2", "1/2"]
    finally:
        d.kill()
        d.wait()


def test_a_torch_ddp_script_and_the_venvs_own_python(venv, tmp_path):
    if not os.access(TORCH_PYTHON, os.X_OK):
        missing_tool(f"the torch 2.x venv's python at {TORCH_PYTHON}")
    v = str(venv / "bin")
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    env = bare_env(OUT=str(tmp_path), PYTHON_EXEC=TORCH_PYTHON, OMP_NUM_THREADS="1")
    p = run([f"{v}/ddprun", "--standalone", "--nproc-per-node=2", str(script)], env=env,
            timeout=180)
    assert p.returncode == 0, p.stderr
    assert f"Python workers run {TORCH_PYTHON} (PYTHON_EXEC)" in p.stderr
    assert [(tmp_path / r).read_text() for r in ("0", "1")] == ["3.0", "3.0"]
    # Without PYTHON_EXEC, and without the venv on PATH: the venv's own python runs the workers.
    who = tmp_path / "who.py"
    who.write_text("import os, sys\n"
                   "open(os.path.join(os.environ['OUT'], 'exe'), 'w').write(sys.prefix)\n")
    p = run([f"{v}/ddprun", "--standalone", "--nproc-per-node=1", str(who)],
            env=bare_env(OUT=str(tmp_path)))
    assert p.returncode == 0, p.stderr
    assert "(the environment ddprun is installed in)" in p.stderr
    assert os.path.realpath((tmp_path / "exe").read_text()) == os.path.realpath(str(venv))
    # python -m ddprun.launch: torch.distributed.launch's --local-rank=N.
    args = tmp_path / "args.py"
    args.write_text("import os, sys\n"
                    "open(os.path.join(os.environ['OUT'], 'args-' + os.environ['LOCAL_RANK']),"
                    " 'w').write(' '.join(sys.argv[1:]))\n")
    p = run([f"{v}/python", "-m", "ddprun.launch", "--standalone", "--nproc-per-node=2",
             str(args), "--lr", "1"], env=bare_env(OUT=str(tmp_path)))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "args-1").read_text() == "--local-rank=1 --lr 1"


def test_the_programs_run_in_a_bare_debian_root(wheel):
    """Only the base system and python3: no Boost, spdlog, hwloc, Gloo, OpenBLAS."""
    if not os.path.isfile(os.path.join(DEBROOT, "usr/bin/python3")):
        missing_tool(f"a minimal Debian 12 root at {DEBROOT} (debootstrap; scripts/setup.sh)")
    if os.geteuid() != 0:
        missing_tool("root (chroot into the Debian root)")
    for pkg in ("libspdlog1.10", "libhwloc15", "libgloo0", "libopenblas0"):
        assert not os.path.exists(os.path.join(DEBROOT, "var/lib/dpkg/info", pkg + ".list"))
    inside = f"/tmp/ddp-wheel-{uuid.uuid4().hex[:8]}"
    where = DEBROOT + inside
    os.makedirs(where)
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extractall(where)
        for prog in os.listdir(os.path.join(where, "ddprun.scripts")):
            os.chmod(os.path.join(where, "ddprun.scripts", prog), 0o755)
        bin_ = f"{inside}/ddprun.scripts"
        script = (f"ldd {bin_}/ddprun {bin_}/ddprund {bin_}/ddpstore {bin_}/ddp-train "
                  f"| grep 'not found'; {bin_}/ddprun --version && "
                  f"cd {inside} && {bin_}/ddprun --standalone --nproc-per-node=2 --no-python "
                  f"{bin_}/ddp-train {' '.join(TRAIN)} --snapshot {inside}/s.ddp")
        # A private mount namespace: /proc inside the root for this command only.
        p = run(["unshare", "-m", "sh", "-c",
                 f"mount -t proc proc {DEBROOT}/proc && exec chroot {DEBROOT} sh -c \"$0\"",
                 script], timeout=180)
        assert "not found" not in p.stdout, p.stdout
        assert p.returncode == 0, p.stdout + p.stderr
        assert f"ddprun {project_version()} (wheel build)" in p.stdout
        assert "final state  succeeded" in p.stderr
    finally:
        shutil.rmtree(where, ignore_errors=True)
