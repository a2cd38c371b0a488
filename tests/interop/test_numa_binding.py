"""--numa-binding for real (issue 16): ddprun computes each local rank's CPUs from an hwloc XML
topology (DDPRUN_HWLOC_XML, tests/data/topologies) and fake GPUs (DDPRUN_NVIDIA_GPUS_DIR laid out
like /proc/driver/nvidia/gpus), binds the worker between fork and exec, and the worker reads its
own affinity (sched_getaffinity) and memory policy (get_mempolicy). ddprun runs pinned to CPUs
0-1 (or 1 only), so what a rank may get is known; machines without CPUs 0 and 1 skip."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

import pytest

from conftest import BIN

DDPRUN = os.path.join(BIN, "ddprun")
TOPOLOGIES = os.path.join(os.path.dirname(__file__), "..", "data", "topologies")
TWO_PU = os.path.join(TOPOLOGIES, "two_pu_2s2g.xml")  # PU 0 + GPU 01 on node 0, PU 1 + 81 on 1
GPU_BOX = os.path.join(TOPOLOGIES, "gpu_box_2s8g.xml")  # 2 x 16 cores x 2 PUs, 4 GPUs per node
BOX_GPUS = ["07", "0f", "47", "4e", "87", "90", "b7", "bd"]

pytestmark = pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0),
                                reason="needs CPUs 0 and 1 in this process's affinity")

WORKER = textwrap.dedent("""
    import ctypes, json, os, platform, sys
    policy = None
    nr = {"x86_64": 239, "aarch64": 236}.get(platform.machine())  # get_mempolicy
    if nr is not None:
        libc = ctypes.CDLL(None, use_errno=True)
        mode, mask = ctypes.c_int(), (ctypes.c_ulong * 16)()
        if libc.syscall(nr, ctypes.byref(mode), mask, ctypes.c_ulong(16 * 64), None,
                        ctypes.c_ulong(0)) == 0:
            policy = [mode.value, mask[0]]
    out = {"cpus": sorted(os.sched_getaffinity(0)), "policy": policy}
    with open(os.path.join(sys.argv[1], os.environ["LOCAL_RANK"]), "w") as f:
        json.dump(out, f)
""")
MPOL_PREFERRED = 1


def fake_gpus(folder, buses):
    """A folder laid out like /proc/driver/nvidia/gpus."""
    os.makedirs(folder, exist_ok=True)
    for i, bus in enumerate(buses):
        d = os.path.join(folder, f"0000:{bus}:00.0")
        os.makedirs(d)
        with open(os.path.join(d, "information"), "w") as f:
            f.write(f"Model: \t\t NVIDIA Test\nGPU UUID: \t\t GPU-{i:08x}-0000-0000-0000-000000000000\n")
    return folder


def run(tmp_path, mode, nproc, topology, buses, cpus=(0, 1), extra_env=None):
    """ddprun pinned to `cpus`; returns (process, {local rank: worker report})."""
    tmp_path = pathlib.Path(tempfile.mkdtemp(dir=tmp_path))  # a fresh folder for each run
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",)}
    env.update(PYTHON_EXEC=sys.executable,
               DDPRUN_NVIDIA_GPUS_DIR=fake_gpus(str(tmp_path / "gpus"), buses))
    if topology:
        env["DDPRUN_HWLOC_XML"] = topology
    env.update(extra_env or {})
    p = subprocess.run([DDPRUN, "--standalone", f"--nproc-per-node={nproc}",
                        f"--numa-binding={mode}", str(script), str(out)],
                       capture_output=True, text=True, timeout=120, env=env,
                       preexec_fn=lambda: os.sched_setaffinity(0, set(cpus)))
    reports = {int(f): json.loads((out / f).read_text()) for f in os.listdir(out)}
    return p, reports


@pytest.mark.parametrize("mode", ["node", "socket", "exclusive", "core-complex"])
def test_each_rank_runs_on_its_gpus_cpus(tmp_path, mode):
    p, reports = run(tmp_path, mode, 2, TWO_PU, ["01", "81"])
    assert p.returncode == 0, p.stderr
    assert reports[0]["cpus"] == [0] and reports[1]["cpus"] == [1], reports
    if reports[0]["policy"] is not None:  # memory preferred from the GPU's node (node 0 exists)
        assert reports[0]["policy"] == [MPOL_PREFERRED, 1], reports


def test_cuda_visible_devices_picks_the_gpu(tmp_path):
    # Only the second GPU is visible: it is local rank 0's, and it sits on PU 1.
    p, reports = run(tmp_path, "node", 1, TWO_PU, ["01", "81"],
                     extra_env={"CUDA_VISIBLE_DEVICES": "1"})
    assert p.returncode == 0, p.stderr
    assert reports[0]["cpus"] == [1], reports


def test_without_gpus_ranks_are_spread_over_numa_nodes(tmp_path):
    p, reports = run(tmp_path, "node", 2, TWO_PU, [])
    assert p.returncode == 0, p.stderr
    assert reports[0]["cpus"] == [0] and reports[1]["cpus"] == [1], reports
    # Only CPU 1 is ddprun's: node 0 has none of it, so both ranks share node 1's.
    p, reports = run(tmp_path, "node", 2, TWO_PU, [], cpus=(1,))
    assert p.returncode == 0, p.stderr
    assert reports[0]["cpus"] == [1] and reports[1]["cpus"] == [1], reports


def test_never_a_cpu_outside_ddpruns_affinity(tmp_path):
    # GPUs 0-3 sit on node 0 (PUs 0-15, 32-47), but ddprun may use CPUs 0-1 only.
    p, reports = run(tmp_path, "node", 2, GPU_BOX, BOX_GPUS)
    assert p.returncode == 0, p.stderr
    assert reports[0]["cpus"] == [0, 1] and reports[1]["cpus"] == [0, 1], reports
    # Rank 0's GPU is on node 0, which has no CPU of ddprun's (only 1... of node 1): exit 2.
    p, reports = run(tmp_path, "node", 1, TWO_PU, ["01", "81"], cpus=(1,))
    assert p.returncode == 2 and not reports, p.stderr
    assert "--numa-binding=node: local rank 0 belongs to NUMA node 0, which has none of " \
           "ddprun's CPUs (1)" in p.stderr


def test_unsatisfiable_modes_exit_2_naming_the_flag(tmp_path):
    # exclusive: 4 GPUs on node 0 but only 2 of its cores are ddprun's (torch raises too).
    p, reports = run(tmp_path, "exclusive", 8, GPU_BOX, BOX_GPUS)
    assert p.returncode == 2 and not reports, p.stderr
    assert "--numa-binding=exclusive: NUMA node 0 has 2 physical cores" in p.stderr
    # More local ranks than GPUs: torch fails on the missing device, ddprun says which rank.
    p, reports = run(tmp_path, "node", 3, TWO_PU, ["01", "81"])
    assert p.returncode == 2 and not reports, p.stderr
    assert "--numa-binding=node: local rank 2 has no GPU of its own" in p.stderr


def test_a_single_numa_node_is_a_noted_no_op(tmp_path):
    nodes = [d for d in os.listdir("/sys/devices/system/node") if d.startswith("node")]
    if len(nodes) != 1:
        pytest.skip(f"this machine has {len(nodes)} NUMA nodes")
    p, reports = run(tmp_path, "node", 2, None, [])  # this machine, as hwloc sees it
    assert p.returncode == 0, p.stderr
    assert reports[0]["cpus"] == [0, 1] and reports[1]["cpus"] == [0, 1], reports
    assert "ddprun: --numa-binding=node: hwloc finds a single NUMA node here" in p.stderr
