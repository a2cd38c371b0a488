"""In-place recovery (issue 34): a ddp-train rank SIGKILLed mid-run is replaced alone; the other
ranks, on every node, keep their processes and state, drop the step in flight, rebuild their
communicators with the replacement and send it the state of a survivor (no disk read). The run
then ends with the parameters of an uninterrupted run, bit for bit (CPU, same reduction order),
and its losses. Without the flag, or with no restarts left, a death restarts or stops the job as
torchrun's would. Every run is bounded (a timeout), its files in the test's tmp_path."""
import json
import os
import re
import subprocess

import pytest

from ddprun_multinode_helpers import DDPRUN, agent_env, free_port, popen_retry

BIN = os.path.dirname(DDPRUN)
TRAIN = os.path.join(BIN, "ddp-train")


def leftovers(tag):
    """The processes whose command line names `tag` (a test's own files): none may outlive a
    job."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if tag in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def job(tmp_path, name, nodes, nproc, fault=None, recovery="in-place", max_restarts=3,
        save_every=0, launcher_args=(), train_args=()):
    """Runs `nodes` agents of nproc ranks (standalone for one node, c10d otherwise) to the end;
    returns (exit codes, the agents' stderr together, rank 0's metrics). Asserts that no
    process of the job is left."""
    metrics = tmp_path / f"{name}.json"
    train = [TRAIN, "2", str(save_every), "--model", "linear", "--dataset", "synthetic",
             "--synthetic-size",
             "6144", "--batch-size", "32", "--threads", "1", "--no-eval", "--recovery", recovery,
             *train_args,
             "--snapshot", str(tmp_path / f"{name}.ddp"), "--metrics-json", str(metrics)]
    if nodes == 1:
        where = ["--standalone"]
    else:
        where = [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-id={name}",
                 f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    argv = [DDPRUN, *where, f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
            *launcher_args, "--no-python", *train]
    env = agent_env({"DDP_TRAIN_FAULT": fault} if fault else {})
    procs, errs = [], []
    for n in range(nodes):
        err = open(tmp_path / f"{name}.{n}.err", "w+")
        errs.append(err)
        procs.append(popen_retry(argv, stdout=err, stderr=err, stdin=subprocess.DEVNULL, env=env))
    try:
        codes = [p.wait(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = ""
    for e in errs:
        e.seek(0)
        text += e.read()
        e.close()
    assert leftovers(str(metrics)) == [], text
    return codes, text, (json.loads(metrics.read_text()) if metrics.exists() else None)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs: one node of 3 ranks, and 2 nodes of 2."""
    out = {}
    for nodes, nproc in ((1, 3), (2, 2)):
        codes, text, m = job(tmp_path_factory.mktemp("ref"), f"ref{nodes}", nodes, nproc)
        assert codes == [0] * nodes and m, text
        out[nodes] = m
    return out


def assert_healed_equal(codes, text, m, ref, nodes, losses_from=0):
    assert codes == [0] * nodes, text
    assert "replaced in place, the others go on (heal 1;" in text, text
    assert re.search(r"restarts +0 ", text), text       # nobody else restarted
    assert re.search(r"healed +1 in place", text), text
    assert "no disk read" in text, text
    assert m["param_checksum"] == ref["param_checksum"], text
    # Rank 0's losses (a replacement rank 0 has those from its heal on).
    assert m["step_losses"] == ref["step_losses"][losses_from:], text
    assert m["global_step"] == ref["global_step"]


def test_one_node_a_killed_rank_heals_and_the_run_is_the_uninterrupted_one(tmp_path, reference):
    trace = tmp_path / "trace.json"
    codes, text, m = job(tmp_path, "one", 1, 3, fault="1:20:kill",
                         launcher_args=[f"--trace={trace}"])
    assert_healed_equal(codes, text, m, reference[1], 1)
    assert "rank 1 kills itself at step 20" in text
    assert "step 20 dropped, healing in place" in text  # survivors, over shared memory
    # the agent tells the node's other workers on their control pipes (NCCL would not see it)
    assert "ddp-train rank 0: rank 1 was lost (heal 1)" in text, text
    assert "ddp-train rank 2: rank 1 was lost (heal 1)" in text, text
    assert re.search(r"ddprun: rank 1 \(local_rank 1\), heal 1, healed in \d+\.\d+ s", text)
    # The trace: the heal is a span of the launcher's, inside the run phase, naming the rank.
    spans = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    heals = [e for e in spans if e["name"] == "heal"]
    assert len(heals) == 1, heals
    assert "rank 1 (local_rank 1), heal 1" in heals[0]["args"]["detail"], heals
    run = [e for e in spans if e["name"] == "run"]
    assert len(run) == 1 and run[0]["ts"] <= heals[0]["ts"], run
    assert heals[0]["ts"] + heals[0]["dur"] <= run[0]["ts"] + run[0]["dur"], (run, heals)


def test_two_nodes_heal_over_the_network(tmp_path, reference):
    codes, text, m = job(tmp_path, "two", 2, 2, fault="2:25:kill")
    assert_healed_equal(codes, text, m, reference[2], 2)
    # Every survivor, on both nodes, dropped the step and healed; none was started again.
    for r in (0, 1, 3):
        assert f"ddp-train rank {r}: " in text and "healed in" in text, text
    assert len(re.findall(r"DDP_TRAIN_FAULT: rank 2 kills itself", text)) == 1


def test_rank_0_dies_and_rank_1_sends_the_state(tmp_path, reference):
    codes, text, m = job(tmp_path, "zero", 1, 3, fault="0:15:kill")
    assert_healed_equal(codes, text, m, reference[1], 1, losses_from=15)
    assert "ddp-train rank 0: replacement (heal 1): rank 1's state at global step 15" in text


def test_no_restarts_left_no_heal(tmp_path):
    codes, text, _ = job(tmp_path, "budget", 1, 3, fault="1:20:kill", max_restarts=0)
    assert codes == [137], text  # the root cause's signal, as without in-place recovery
    assert "replaced in place" not in text, text
    assert "Signal 9 (SIGKILL)" in text, text


def test_without_the_flag_the_job_restarts_as_torchrun(tmp_path, reference):
    codes, text, m = job(tmp_path, "restart", 1, 3, fault="1:20:kill", recovery="restart")
    assert codes == [0], text
    assert "replaced in place" not in text, text
    assert "restarting the workers of every node, restart 1 of 3" in text, text


# Deaths at other moments of a step (DDP_TRAIN_FAULT's kill@... forms), a death during a heal
# and two at once. Every run ends with the uninterrupted run's parameters and step count.


def test_killed_during_the_allreduce_over_the_network(tmp_path, reference):
    # The victim's backward has started the gradient all-reduce: the survivors are inside it.
    codes, text, m = job(tmp_path, "inflight", 2, 2, fault="1:25:kill@allreduce")
    assert_healed_equal(codes, text, m, reference[2], 2)
    assert "rank 1 kills itself during the all-reduce at step 25" in text, text


def test_killed_after_the_allreduce(tmp_path, reference):
    # The step was reduced and applied everywhere; the next step's all-reduce finds it gone.
    codes, text, m = job(tmp_path, "after", 1, 3, fault="2:20:kill@after")
    assert_healed_equal(codes, text, m, reference[1], 1)
    assert "rank 2 kills itself after the all-reduce at step 20" in text, text
    assert "step 21 dropped, healing in place" in text, text


def test_rank_0_killed_mid_snapshot_leaves_the_last_snapshot_whole(tmp_path, reference):
    # Rank 0 dies between writing the end-of-epoch snapshot and committing it (the rename).
    codes, text, m = job(tmp_path, "snap", 1, 3, fault="0:64:kill@snapshot", save_every=1)
    assert_healed_equal(codes, text, m, reference[1], 1, losses_from=64)
    assert "rank 0 kills itself mid-snapshot at step 64" in text, text
    # The replacement's end-of-run snapshot is whole, and the dead writer's temporary is gone.
    assert (tmp_path / "snap.ddp").stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir() if ".tmp." in p.name] == []
    assert (f"ddp-train: snapshot {tmp_path / 'snap.ddp'} written (every SAVE_EVERY epochs): "
            "epoch 2 step 0 global step 128") in text, text


def healed_or_restarted(codes, text, m, ref, nodes):
    """Two deaths close together: healed one by one, or (both seen in one look) the job restarts
    as torchrun's would. Either way the run is the uninterrupted one."""
    assert codes == [0] * nodes, text
    assert m["param_checksum"] == ref["param_checksum"], text
    assert m["global_step"] == ref["global_step"], text
    # Every node's exit summary counts the job's heals.
    healed = max((int(n) for n in re.findall(r"healed +(\d+) in place", text)), default=0)
    restarted = "restarting the workers of every node" in text
    assert healed == 2 or restarted, text
    return healed, restarted


def test_a_second_death_during_the_heal(tmp_path, reference):
    # Rank 1 dies; rank 2 dies as it begins to heal (before joining the new communicators).
    codes, text, m = job(tmp_path, "twice", 1, 3, fault="1:20:kill,2:20:kill@heal")
    healed_or_restarted(codes, text, m, reference[1], 1)
    assert "rank 2 kills itself entering the heal at step 20" in text, text


def test_two_ranks_at_once_on_two_nodes(tmp_path, reference):
    codes, text, m = job(tmp_path, "pair", 2, 2, fault="1:25:kill,2:25:kill")
    healed_or_restarted(codes, text, m, reference[2], 2)
    assert len(re.findall(r"kills itself at step 25", text)) == 2, text


def test_two_ranks_of_one_node_at_once(tmp_path, reference):
    # Both of node 1's ranks die at one step boundary. Seen together, the agent restarts the job
    # (torchrun's rule for more than one death); node 0's ranks, already healing, are stopped
    # while they wait for the new ranks and rank 0 saves the step they held first, so the
    # restarted job resumes there and loses nothing. Seen one by one, both are healed.
    codes, text, m = job(tmp_path, "node", 2, 2, fault="2:25:kill,3:25:kill")
    healed, restarted = healed_or_restarted(codes, text, m, reference[2], 2)
    saved = re.search(r"written \((stop signal|a peer failed)\): epoch 0 step 25 ", text)
    if restarted and saved:
        assert m["resumed_from"] == {"epoch": 0, "step": 25}, (m["resumed_from"], text)
    # Without `saved`: the survivors did not end on the agent's SIGTERM in its grace (the
    # 30 s case of docs/perf.md's lost-node bench) and the job went back to the start.


# Sharded engines (--sharding): each rank's shard is copied to its successor every step
# (--shard-copy-every 1, the default); a replacement takes its shard from that copy.


def sharded_pair(tmp_path, level, nodes, nproc, fault):
    """An uninterrupted run and a run with `fault`, both with --sharding `level`."""
    ref = job(tmp_path, f"ref-{level}", nodes, nproc, train_args=["--sharding", level])
    assert ref[0] == [0] * nodes and ref[2], ref[1]
    return ref[2], job(tmp_path, f"{level}", nodes, nproc, fault=fault,
                       train_args=["--sharding", level])


def test_sharded_full_heals_from_the_successors_copy(tmp_path):
    ref, (codes, text, m) = sharded_pair(tmp_path, "full", 1, 3, "1:20:kill")
    assert_healed_equal(codes, text, m, ref, 1)
    assert "rank 1: replacement (heal 1): rank 2's state at global step 20" in text, text


def test_sharded_optimizer_state_heals_over_the_network(tmp_path):
    ref, (codes, text, m) = sharded_pair(tmp_path, "optimizer", 2, 2, "3:25:kill@allreduce")
    assert_healed_equal(codes, text, m, ref, 2)
    assert "rank 3: replacement (heal 1): rank 0's state at global step 25" in text, text


def test_sharded_a_rank_and_its_successor_dying_together_restart_the_job(tmp_path):
    # Rank 2 holds rank 1's only copy: with both gone the job restarts (no snapshot on disk
    # here: from the start), and still ends as the uninterrupted run.
    ref, (codes, text, m) = sharded_pair(tmp_path, "full", 1, 3, "1:20:kill,2:20:kill")
    assert codes == [0], text
    assert m["param_checksum"] == ref["param_checksum"], text
    assert "restarting the workers of every node" in text, text
    if "replaced in place" in text:  # seen one by one: the heal itself found no copy
        assert "rank 1's shard has no copy: its holder, rank 2, was replaced too" in text, text
