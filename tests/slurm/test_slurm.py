"""ddprun under a real Slurm (2 nodes, see conftest.py): every sbatch script in slurm/ runs to
success with the right world size and ranks; scancel stops every worker after ddp-train has
written its snapshot (and SIGUSR1 saves and goes on); a node whose agent is killed mid-job
leaves an elastic job (--nnodes=1:2, --max-restarts) running on the survivor."""
import os
import re
import signal
import time

import pytest

from conftest import ROOT, by_program, wait_gone, worker_pids
from support.tls_certs import make_pki, node_cert

SLURM_DIR = os.path.join(ROOT, "slurm")
TOY = os.path.join(SLURM_DIR, "examples/ddp_toy.py")
# The small job every ddp-train script runs: 1 epoch of 1024 Fashion-MNIST samples.
SMALL = ["--train-subset", "1024", "--batch-size", "64", "--no-eval"]
# Test-cluster sizes in place of the scripts' production ones (2 fake GPUs, 8 CPUs a node).
GPU_NODE = ["--gpus-per-node=2", "--cpus-per-task=4"]


def ddp_train_result(log):
    world = re.search(r"world size (\d+), batch 64 per rank", log)
    steps = re.search(r"ddp-train: (\d+) steps in", log)
    assert world and steps, log
    return int(world.group(1)), int(steps.group(1))


@pytest.mark.parametrize("script,opts,env,world", [
    ("ddp-train-1node.sbatch", GPU_NODE, {"DEVICE": "cpu"}, 2),  # a worker per (fake) GPU
    ("ddp-train-1node-cpu.sbatch", [], {}, 4),                   # --ntasks-per-node=4
    ("ddp-train-multinode.sbatch", GPU_NODE, {"DEVICE": "cpu"}, 4),
    ("ddp-train-multinode-cpu.sbatch", [], {}, 4),               # 2 nodes x NPROC_PER_NODE=2
])
def test_ddp_train_scripts(cluster, tmp_path, script, opts, env, world):
    snap = str(tmp_path / "snap")
    jid = cluster.sbatch(os.path.join(SLURM_DIR, script), *SMALL, sbatch_opts=opts,
                         env={"SNAPSHOT": snap, "EPOCHS": "1", **env})
    state, code, log = cluster.wait(jid)
    assert (state, code) == ("COMPLETED", "0:0"), log
    got_world, steps = ddp_train_result(log)
    assert got_world == world, log
    assert steps == 1024 // (64 * world), log  # the data really was split over `world` ranks
    assert os.path.exists(snap)
    multi = "multinode" in script
    # What ddprun took from Slurm, printed by every agent.
    notices = re.findall(r"ddprun: Slurm job (\S+): defaults from SLURM_\*:(.*)\(flags", log)
    assert len(notices) == (2 if multi else 1), log
    if multi:
        assert {n[1].split("--node-rank=")[1].split()[0] for n in notices} == {"0", "1"}
        assert all("--nnodes=2" in n[1] and "rendezvous host dn1" in n[1] for n in notices)
        assert all(n[0] == jid + ".0" for n in notices)
    if "cpu" not in script or not multi:
        assert f"--nproc-per-node={world // (2 if multi else 1)}" in notices[0][1], log


@pytest.mark.parametrize("script,opts,tls", [
    ("torch-script-multinode.sbatch", GPU_NODE, False),
    ("torch-script-multinode-cpu.sbatch", [], False),
    # One variable turns TLS on (docs/security.md, "TLS on the store"): the agents' stores
    # then take TLS from ddprun's clients, and the unmodified torch workers stay plain.
    ("torch-script-multinode-cpu.sbatch", [], True),
])
def test_torch_script_runs_unchanged(cluster, tmp_path, script, opts, tls):
    env = {}
    if tls:
        d = str(tmp_path / "tls")
        make_pki(d)
        cert, key = node_cert(d, "node", "DNS:dn1,DNS:dn2,IP:127.0.0.1")
        env["DDPRUN_TLS_DIR"] = d
    jid = cluster.sbatch(os.path.join(SLURM_DIR, script), TOY, "--steps", "5", sbatch_opts=opts,
                         env=env)
    state, code, log = cluster.wait(jid)
    if tls:
        assert "TLS and plain" in log, log
    assert (state, code) == ("COMPLETED", "0:0"), log
    lines = re.findall(r"ddp_toy: rank (\d+)/(\d+) local_rank (\d+) node (\S+)", log)
    # torch 2.15's gloo can abort one rank at teardown ("terminate called without an active
    # exception", with the previous main's ddprun too); ddprun then restarts the job, which is
    # right, so a rank may print its first step once per attempt. Each attempt has the layout.
    lines = sorted(set(lines))
    assert sorted(int(r) for r, _, _, _ in lines) == [0, 1, 2, 3], log
    assert {w for _, w, _, _ in lines} == {"4"}
    # Two nodes, two local ranks each, ranks contiguous per node.
    by_node = {}
    for r, _, lr, node in lines:
        by_node.setdefault(node, []).append((int(r), int(lr)))
    assert sorted(by_node) == ["dn1", "dn2"], log
    for ranks in by_node.values():
        ranks.sort()
        assert [lr for _, lr in ranks] == [0, 1]
        assert ranks[1][0] == ranks[0][0] + 1
    assert "ddp_toy: done steps 5" in log
    # The recipe's per-job secret and the round's admission let every worker in (issue 22).
    assert "refused a connection" not in log, log


@pytest.mark.parametrize("script,usr1,agents", [
    # srun steps: `scancel --signal=USR1` (what --signal=USR1@60 sends) reaches every process.
    ("ddp-train-multinode-cpu.sbatch", ["--signal=USR1"], 2),
    # One node: --signal=B:USR1@60 reaches only the batch shell, which the script replaced with
    # ddprun (exec), so the workers get it only through ddprun.
    ("ddp-train-1node-cpu.sbatch", ["--batch", "--signal=USR1"], 1),
])
def test_usr1_saves_and_scancel_stops_every_worker_after_the_snapshot(cluster, tmp_path, script,
                                                                       usr1, agents):
    snap = str(tmp_path / "cancelled.snapshot")
    # A long run (1000 epochs, cancelled long before); SAVE_EVERY=0, so any snapshot comes from
    # a signal.
    jid = cluster.sbatch(os.path.join(SLURM_DIR, script),
                         "--batch-size", "8", "--log-every", "50", "--no-eval",
                         env={"SNAPSHOT": snap, "EPOCHS": "1000", "SAVE_EVERY": "0"})
    try:
        cluster.wait_for_line(jid, r"epoch 1/1000 step \d+/")
        procs = by_program(snap)  # srun carries the path in its argv too
        assert (procs.get("ddprun"), procs.get("ddp-train")) == (agents, 4), procs

        # SIGUSR1: a snapshot, and the job goes on.
        cluster.scancel(jid, *usr1)
        cluster.wait_for_line(jid, r"snapshot \S+ written \(SIGUSR1\)")
        time.sleep(1)
        assert cluster.running(jid), cluster.log(jid)
        os.unlink(snap)

        cluster.scancel(jid)  # SIGTERM to every process of the job, SIGKILL after KillWait=5 s
        state, _, log = cluster.wait(jid, timeout=60)
    finally:
        cluster.cancel_quietly(jid)
    print(log)
    assert state == "CANCELLED", log
    assert log.count("passing it on to the workers") == agents, log  # each agent, once
    assert "restarting the workers" not in log, log  # SIGUSR1 killed nobody
    assert "received signal 15 (Terminated), forwarding it to the workers" in log, log
    # Rank 0 saves at its next step boundary, or, if another rank stopped at an earlier one,
    # when it finds that rank gone in the step's all-reduce: on the stop signal either way.
    assert re.search(r"snapshot \S+ written \(stop signal\)", log), log
    assert not re.search(r"ddp-train rank \d+: error", log), log  # no rank reports a failure
    assert os.path.exists(snap), log
    assert wait_gone(snap) == [], log


def test_a_requeued_job_resumes_from_its_snapshot(cluster):
    """scontrol requeue (what preemption and node failure do): SIGTERM, the snapshot, and the job
    runs again under the same id, so the script's default SNAPSHOT (per job id) is found and
    training goes on from the step it stopped at."""
    jid = cluster.sbatch(os.path.join(SLURM_DIR, "ddp-train-multinode-cpu.sbatch"),
                         "--batch-size", "8", "--train-subset", "40000", "--log-every", "200",
                         "--no-eval", env={"EPOCHS": "1", "SAVE_EVERY": "0"})
    snap = os.path.join(cluster.workdir, f"ddp-train-multinode-cpu-{jid}.snapshot")
    try:
        cluster.wait_for_line(jid, r"epoch 1/1 step [1-9]\d*/1250")
        cluster.scontrol("requeue", jid)
        # A requeued job waits 120 s (its begin time): release it once it is pending again (the
        # requeue sets the begin time on its way there, so until it runs).
        deadline = time.monotonic() + 60
        while cluster.state(jid)[0] == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.2)  # the requeue stops it first
        while cluster.state(jid)[0] != "RUNNING" and time.monotonic() < deadline:
            if cluster.state(jid)[0] == "PENDING":
                cluster.scontrol("update", f"JobId={jid}", "StartTime=now")
            time.sleep(1)
        state, code, log = cluster.wait(jid)
    finally:
        cluster.cancel_quietly(jid)
    print(log)
    assert (state, code) == ("COMPLETED", "0:0"), log
    resumed = re.search(r"resuming from snapshot (\S+): epoch 0 step (\d+)", log)
    assert resumed and resumed.group(1) == snap, log
    done = int(resumed.group(2))
    assert 0 < done < 1250, log
    assert f"ddp-train: {1250 - done} steps in" in log, log  # only what was left
    assert re.search(r"written \(end of run\): epoch 1 step 0 global step 1250", log), log


def test_a_killed_agent_leaves_the_elastic_job_running_on_the_survivor(cluster, tmp_path):
    snap = str(tmp_path / "elastic.snapshot")
    job = tmp_path / "elastic.sbatch"
    job.write_text(f"""#!/bin/bash
#SBATCH --job-name=elastic --nodes=2 --ntasks-per-node=1 --cpus-per-task=2
srun --kill-on-bad-exit=0 bash -c 'echo $$ > {tmp_path}/agent-$SLURMD_NODENAME.pid; \\
  exec ddprun --rdzv-backend=c10d --nnodes=1:2 --max-restarts=2 --nproc-per-node=1 \\
  ddp-train --snapshot {snap} --batch-size 8 --train-subset 16000 --log-every 100 --no-eval 1 1'
echo "srun exit $?"
""")
    jid = cluster.sbatch(str(job))
    try:
        cluster.wait_for_line(jid, r"epoch 1/1 step [1-9]\d\d/1000")
        agent = int((tmp_path / "agent-dn2.pid").read_text())
        assert "ddprun" in open(f"/proc/{agent}/cmdline").read()
        os.kill(agent, signal.SIGKILL)  # dn2's agent dies; dn1 hosts the store and goes on
        state, _, log = cluster.wait(jid)
    finally:
        cluster.cancel_quietly(jid)
    print(log)
    after = log[log.index("world size 2"):]
    assert re.search(r"restarting the workers|re-forming the job", after), log
    # The survivor alone: ddp-train's workers regroup into a world of 1 (docs/launcher.md).
    assert "regrouped around its running workers: 1 node, 1 rank " in after, log
    assert re.search(r"ddp-train: \d+ steps in", after), log
    # dn2's task was killed; dn1's agent finished its job normally.
    assert re.search(r"dn2: task 1: Killed", log), log
    assert "dn1: task 0" not in log, log
    assert wait_gone(snap) == [], log


def test_several_agents_on_a_node_are_refused_with_the_fix(cluster, tmp_path):
    """The common slip: #SBATCH --ntasks-per-node=2 and a plain `srun ddprun`, which starts two
    agents a node. ddprun stops (exit 2) and names the srun options to use."""
    job = tmp_path / "two-agents.sbatch"
    job.write_text("#!/bin/bash\n#SBATCH --job-name=two-agents --nodes=2 --ntasks-per-node=2\n"
                   "srun ddprun --rdzv-backend=c10d ddp-train --max-steps 1 1 0\n")
    jid = cluster.sbatch(str(job))
    state, code, log = cluster.wait(jid)
    assert (state, code) == ("FAILED", "2:0"), log
    assert log.count("2 ddprun tasks on this node") == 4, log
    assert "srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES" in log, log
    assert "ddp-train:" not in log, log  # no worker started
