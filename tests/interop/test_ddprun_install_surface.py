"""What a user checks before trusting a tool, and what a cluster's other tools read (issue 33),
with the real binaries: --version on each of them (one version, CMake's), the interpreter the
agent chose for Python workers named at start (PYTHON_EXEC wins; a source build keeps
python3 from PATH), and DCGM's job mapping files (--gpu-job-mapping-dir) written for the GPUs
the workers use while the job runs and removed at exit (fake GPUs through
DDPRUN_NVIDIA_GPUS_DIR; the exporter itself is not needed to read files)."""
import os
import re
import subprocess

from conftest import BIN

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


def project_version():
    text = open(os.path.join(ROOT, "CMakeLists.txt")).read()
    return re.search(r"project\(ddprun VERSION (\d+\.\d+\.\d+)", text).group(1)


def test_every_binary_prints_the_one_version():
    v = project_version()
    for name in ("ddprun", "ddprund", "ddpstore", "ddp-train"):
        p = subprocess.run([os.path.join(BIN, name), "--version"], capture_output=True,
                           text=True, timeout=30)
        assert p.returncode == 0, (name, p.stdout, p.stderr)
        assert p.stdout.strip() == f"{name} {v} (source build)", (name, p.stdout)
    assert f"## {v} " in open(os.path.join(ROOT, "CHANGELOG.md")).read()
    assert "BSD 3-Clause" in open(os.path.join(ROOT, "LICENSE")).read()


def test_the_workers_python_is_named_at_start(tmp_path):
    script = tmp_path / "w.py"
    script.write_text("import sys; open(sys.argv[1], 'w').write(sys.executable)\n")
    out = tmp_path / "exe"
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_EXEC"}
    p = subprocess.run([os.path.join(BIN, "ddprun"), "--standalone", "--nproc-per-node=1",
                        str(script), str(out)], capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode == 0, p.stderr
    assert "ddprun: Python workers run python3 (python3 from PATH)" in p.stderr
    # PYTHON_EXEC wins, and is what the worker runs.
    py = os.path.realpath(subprocess.run(["python3", "-c", "import sys; print(sys.executable)"],
                                         capture_output=True, text=True).stdout.strip())
    env["PYTHON_EXEC"] = py
    p = subprocess.run([os.path.join(BIN, "ddprun"), "--standalone", "--nproc-per-node=1",
                        str(script), str(out)], capture_output=True, text=True, timeout=120,
                       env=env)
    assert p.returncode == 0, p.stderr
    assert f"ddprun: Python workers run {py} (PYTHON_EXEC)" in p.stderr
    assert os.path.realpath(out.read_text()) == py
    # A program needs no interpreter: nothing is said.
    p = subprocess.run([os.path.join(BIN, "ddprun"), "--standalone", "--nproc-per-node=1",
                        "--no-python", "/bin/true"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "Python workers run" not in p.stderr, p.stderr


def fake_gpus(folder, n):
    for i in range(n):
        d = folder / f"0000:{0x1a + 0x20 * i:02x}:00.0"
        d.mkdir(parents=True)
        (d / "information").write_text(
            f"Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-{i:08x}-1111-2222-3333-444455556666\n"
            f"Bus Location: \t {d.name}\nDevice Minor: \t {i}\n")


def test_dcgm_job_mapping_files_name_the_job_while_it_runs(tmp_path):
    gpus, mapping = tmp_path / "gpus", tmp_path / "mapping"
    fake_gpus(gpus, 4)
    mapping.mkdir()
    (mapping / "2").write_text("another-job\n")
    # Each worker copies the mapping folder as it sees it while running.
    worker = ('mkdir -p "$OUT/seen-$LOCAL_RANK" && cp "$MAP"/* "$OUT/seen-$LOCAL_RANK"/ && '
              'echo "$CUDA_VISIBLE_DEVICES" > "$OUT/cvd-$LOCAL_RANK"')
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",
                                                            "SLURM_JOB_ID")}
    env.update(DDPRUN_NVIDIA_GPUS_DIR=str(gpus), OUT=str(tmp_path), MAP=str(mapping),
               CUDA_VISIBLE_DEVICES="1,2,3", SLURM_JOB_ID="98765")
    p = subprocess.run([os.path.join(BIN, "ddprun"), "--standalone", "--nproc-per-node=2",
                        f"--gpu-job-mapping-dir={mapping}", "--no-python", "/bin/sh", "-c",
                        worker], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    # Workers 0 and 1 use visible GPUs 0 and 1: the machine's GPUs 1 and 2.
    for r in (0, 1):
        seen = tmp_path / f"seen-{r}"
        assert sorted(os.listdir(seen)) == ["1", "2"], os.listdir(seen)
        assert (seen / "1").read_text() == "98765\n"
        assert (seen / "2").read_text() == "another-job\n98765\n"
    # At exit: this job's lines are gone, the other job's stay.
    assert sorted(os.listdir(mapping)) == ["2"]
    assert (mapping / "2").read_text() == "another-job\n"
    # A folder that is not there is refused by name, before any worker starts.
    p = subprocess.run([os.path.join(BIN, "ddprun"), "--standalone", "--nproc-per-node=1",
                        f"--gpu-job-mapping-dir={tmp_path}/nope", "--no-python", "/bin/true"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2, p.stderr
    assert "--gpu-job-mapping-dir" in p.stderr and "not a folder" in p.stderr
