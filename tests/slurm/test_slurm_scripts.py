"""Scripts written for Slurm, run by ddprun on the real 2-node cluster (conftest.py), 2 workers a
node: a plain PyTorch script that ranks itself only by SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID
trains correctly with --per-worker-slurm-env; PyTorch Lightning trains with its default cluster
environment (torchrun's variables) and with SLURMEnvironment forced (Slurm's, rewritten by
--per-worker-slurm-env), each rank seeing the right global rank and world size; and
slurm/ddp-train-sharded.sbatch trains with --sharding full, writes a sharded snapshot and a
second job resumes from it; and slurm/ddp-train-fsdp-tp.sbatch trains the LLaMA-style model on
the mesh dp=2 x tp=2 with each tp group on one node.

Run: python3 -m pytest tests/slurm/test_slurm_scripts.py (as root; conftest.py starts the
cluster)."""
import json
import math
import os
import re
import struct

import pytest

from conftest import ROOT

# Only Slurm's variables: torchrun's are removed first, so the script cannot lean on them.
# MASTER_ADDR/MASTER_PORT (and TORCHELASTIC_USE_AGENT_STORE) still say where the store is.
SLURM_RANKED = r'''
import os
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
             "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE"):
    os.environ.pop(name, None)
rank = int(os.environ["SLURM_PROCID"])
world = int(os.environ["SLURM_NTASKS"])
local = int(os.environ["SLURM_LOCALID"])
node = int(os.environ["SLURM_NODEID"])
dist.init_process_group("gloo", rank=rank, world_size=world)

STEPS, BATCH = 5, 16
def batches(r):
    gen = torch.Generator().manual_seed(100 + r)
    for _ in range(STEPS):
        x = torch.randn(BATCH, 8, generator=gen)
        yield x, x.sum(dim=1, keepdim=True)

def train(model, data_of_step):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x, y in data_of_step:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])

torch.manual_seed(0)
weights = train(DDP(torch.nn.Linear(8, 1)), batches(rank))
# DDP averages the gradients: one process on every rank's batch at once must end the same.
torch.manual_seed(0)
reference = train(torch.nn.Linear(8, 1),
                  ((torch.cat([b[0] for b in step]), torch.cat([b[1] for b in step]))
                   for step in zip(*(batches(r) for r in range(world)))))
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
replicas = [torch.zeros_like(weights) for _ in range(world)]
dist.all_gather(replicas, weights)
print(f"ranked: rank {rank} world {world} local {local} node {node} host {socket.gethostname()} "
      f"sum {int(total.item())} replicas_equal {all(torch.equal(replicas[0], r) for r in replicas)} "
      f"matches_reference {torch.allclose(weights, reference, atol=1e-5)} "
      f"gtids {os.environ['SLURM_GTIDS']} tasks_per_node {os.environ['SLURM_TASKS_PER_NODE']}",
      flush=True)
dist.barrier()  # every rank done before any tears down (torch 2.15's gloo, see test_slurm.py)
dist.destroy_process_group()
os._exit(0)  # not torch's exit: its gloo teardown can abort (docs/testing.md)
'''

LIGHTNING = r'''
import os
import socket
import sys

import torch
import torch.distributed as dist
import lightning as L
from lightning.pytorch.plugins.environments import SLURMEnvironment
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(0)
x = torch.randn(256, 8)
data = DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=16)
forced = sys.argv[1] == "slurm"
trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, num_nodes=2, max_steps=4,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=os.getcwd(),
                    plugins=[SLURMEnvironment(auto_requeue=False)] if forced else None)
model = Tiny()
trainer.fit(model, data)
replicas = trainer.strategy.all_gather(torch.cat([p.detach().flatten() for p in model.parameters()]))
print(f"lightning: env {type(trainer.strategy.cluster_environment).__name__} "
      f"global_rank {trainer.global_rank} world_size {trainer.world_size} "
      f"local_rank {trainer.local_rank} node_rank {trainer.node_rank} "
      f"host {socket.gethostname()} torchrun_rank {os.environ['RANK']} steps {trainer.global_step} "
      f"replicas_equal {all(torch.equal(replicas[0], r) for r in replicas)}", flush=True)
dist.barrier()
dist.destroy_process_group()
os._exit(0)  # not torch's exit: its gloo teardown can abort (docs/testing.md)
'''


def submit(cluster, tmp_path, name, script_text, ddprun_flags, script_args=""):
    """One 2-node job: srun starts one ddprun a node, each starting 2 workers of the script."""
    script = tmp_path / f"{name}.py"
    script.write_text(script_text)
    job = tmp_path / f"{name}.sbatch"
    job.write_text(f"""#!/bin/bash
#SBATCH --job-name={name} --nodes=2 --ntasks-per-node=1 --cpus-per-task=4 --time=5
export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK
srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=0 \\
  ddprun --nnodes=2 --nproc-per-node=2 --max-restarts=2 {ddprun_flags} {script} {script_args}
""")
    jid = cluster.sbatch(str(job))
    try:
        state, code, log = cluster.wait(jid, timeout=120)
    finally:
        cluster.cancel_quietly(jid)
    assert (state, code) == ("COMPLETED", "0:0"), log
    return log


def by_rank(lines, log):
    """{rank: fields} from one line per rank; a rank restarted after torch's gloo teardown
    abort (test_slurm.py) may print twice, the same values each time."""
    ranks = {}
    for fields in lines:
        ranks.setdefault(int(fields[0]), set()).add(fields[1:])
    assert sorted(ranks) == [0, 1, 2, 3], log
    assert all(len(v) == 1 for v in ranks.values()), log
    return {r: next(iter(v)) for r, v in ranks.items()}


def check_layout(ranks, log):
    """Two hosts, two local ranks each, global ranks contiguous per node in node order."""
    hosts = {}
    for rank, (local, node, host) in ranks.items():
        hosts.setdefault((int(node), host), []).append((rank, int(local)))
    assert sorted(h for _, h in hosts) == ["dn1", "dn2"], log
    assert sorted(n for n, _ in hosts) == [0, 1], log
    for (node, _), members in hosts.items():
        assert sorted(members) == [(2 * node, 0), (2 * node + 1, 1)], log


def test_a_script_ranked_by_slurm_procid_trains_with_per_worker_slurm_env(cluster, tmp_path):
    log = submit(cluster, tmp_path, "slurm-ranked", SLURM_RANKED, "--per-worker-slurm-env")
    lines = re.findall(r"ranked: rank (\d+) world (\d+) local (\d+) node (\d+) host (\S+) "
                       r"sum (\d+) replicas_equal (\w+) matches_reference (\w+) "
                       r"gtids (\S+) tasks_per_node (\S+)", log)
    ranks = by_rank(lines, log)
    check_layout({r: (f[1], f[2], f[3]) for r, f in ranks.items()}, log)
    for rank, (world, local, node, _, total, equal, ref, gtids, per_node) in ranks.items():
        assert world == "4" and total == "10", log  # 1+2+3+4 over the 4 distinct ranks
        assert equal == "True" and ref == "True", log  # DDP trained one model, the right one
        assert gtids == ("0,1" if node == "0" else "2,3"), log
        assert per_node == "2(x2)", log


@pytest.mark.parametrize("mode,flags,env_class", [
    ("default", "", "TorchElasticEnvironment"),  # Lightning picks torchrun's variables first
    ("slurm", "--per-worker-slurm-env", "SLURMEnvironment"),
])
def test_lightning_trains_2x2_under_ddprun(cluster, tmp_path, mode, flags, env_class):
    log = submit(cluster, tmp_path, f"lightning-{mode}", LIGHTNING, flags, mode)
    lines = re.findall(r"lightning: env (\w+) global_rank (\d+) world_size (\d+) local_rank (\d+) "
                       r"node_rank (\d+) host (\S+) torchrun_rank (\d+) steps (\d+) "
                       r"replicas_equal (\w+)", log)
    ranks = by_rank([(g, env, w, lr, nr, h, tr, s, eq)
                     for env, g, w, lr, nr, h, tr, s, eq in lines], log)
    check_layout({r: (f[2], f[3], f[4]) for r, f in ranks.items()}, log)
    for rank, (env, world, _, _, _, torchrun_rank, steps, equal) in ranks.items():
        assert env == env_class, log
        assert world == "4" and torchrun_rank == str(rank), log
        assert steps == "4" and equal == "True", log


def read_shard_index(path):
    """The DDPSIDX1 index's JSON header (docs/ddp_train.md "Sharded snapshots")."""
    data = open(path, "rb").read()
    assert data[:8] == b"DDPSIDX1", f"{path}: magic {data[:8]!r}, not a sharded snapshot index"
    (hlen,) = struct.unpack_from("<I", data, 8)
    assert 12 + hlen + 8 == len(data), f"{path}: {len(data)} bytes, header {hlen}"
    return json.loads(data[12:12 + hlen])


def test_sharded_script_trains_snapshots_shards_and_a_second_job_resumes(cluster, tmp_path):
    """slurm/ddp-train-sharded.sbatch on 2 nodes x NPROC_PER_NODE=2 with a small MLP: one epoch
    of 1024 samples (4 steps of 64 a rank), an index at SNAPSHOT naming the 4 shard files of
    the last step, all present with their sizes; a second job with the same SNAPSHOT and
    EPOCHS=2 resumes after epoch 1 and trains only epoch 2."""
    script = os.path.join(ROOT, "slurm", "ddp-train-sharded.sbatch")
    snap = tmp_path / "sharded.snapshot"
    small = ["--hidden", "64", "--layers", "3", "--optimizer", "adam", "--train-subset", "1024",
             "--batch-size", "64", "--no-eval"]
    for epochs in (1, 2):
        jid = cluster.sbatch(script, *small, env={"SNAPSHOT": str(snap), "EPOCHS": str(epochs)})
        try:
            state, code, log = cluster.wait(jid)
        finally:
            cluster.cancel_quietly(jid)
        assert (state, code) == ("COMPLETED", "0:0"), log
        assert re.search(r"world size 4, batch 64 per rank, .*sharding full", log), log
        assert "ddp-train: 4 steps in" in log, log  # 1024 / (64 x 4), one epoch each job
        if epochs == 2:
            assert f"resuming from snapshot {snap}: epoch 1 step 0 (global step 4)" in log, log
        assert re.search(rf"sharded snapshot {re.escape(str(snap))} written \([^)]*\): "
                         rf"epoch {epochs} step 0 global step {4 * epochs}", log), log
        index = read_shard_index(snap)
        assert (index["world_size"], index["sharding"], index["epoch"],
                index["global_step"]) == (4, "full", epochs, 4 * epochs), index
        assert len(index["files"]) == 4, index
        for f in index["files"]:
            shard = tmp_path / f["name"]
            assert shard.stat().st_size == f["bytes"], (f, shard)
            assert shard.read_bytes()[:8] == b"DDPSHRD1", shard
        assert {(tmp_path / f["name"]).parent.name for f in index["files"]} == \
            {f"step-{4 * epochs}"}, index
    # The commit removed the first job's step folder.
    assert not (tmp_path / "sharded.snapshot.shards" / "step-4").exists()


def test_fsdp_tp_script_keeps_each_tp_group_on_one_node(cluster, tmp_path):
    """slurm/ddp-train-fsdp-tp.sbatch on 2 nodes x NPROC_PER_NODE=2 with a tiny --model llama:
    the mesh is dp=2 x tp=2 with tp groups [0 1] and [2 3] each on its own node (rank 0's mesh
    line), the job completes, every step's loss and the validation loss are finite, and the
    sharded snapshot's index names the 4 ranks' shards."""
    script = os.path.join(ROOT, "slurm", "ddp-train-fsdp-tp.sbatch")
    snap = tmp_path / "lm.snapshot"
    metrics = tmp_path / "lm-metrics.json"
    tiny = ["--dim", "32", "--n-layers", "1", "--n-heads", "4", "--seq-len", "16",
            "--batch-size", "2", "--epoch-steps", "4", "--eval-seqs", "4",
            "--metrics-json", str(metrics)]
    jid = cluster.sbatch(script, *tiny, env={"SNAPSHOT": str(snap), "EPOCHS": "1"})
    try:
        state, code, log = cluster.wait(jid, timeout=120)
    finally:
        cluster.cancel_quietly(jid)
    assert (state, code) == ("COMPLETED", "0:0"), log
    assert "mesh dp=2,tp=2, sharding full along dp" in log, log
    mesh = re.findall(r"ddp-train: mesh dp=2 x tp=2: tp groups \[0 1\] on (\S+), "
                      r"\[2 3\] on (\S+)", log)
    assert mesh, log
    # ddprun may restart a job (--max-restarts): each attempt prints the same layout.
    assert {tuple(sorted(m)) for m in mesh} == {("dn1", "dn2")}, log
    m = json.loads(metrics.read_text())
    assert m["mesh"] == {"dp": 2, "tp": 2}, m
    assert len(m["step_losses"]) == 4, m
    assert all(math.isfinite(v) for v in m["step_losses"]), m
    assert math.isfinite(m["val_loss"]), m
    index = read_shard_index(snap)
    assert index["world_size"] == 4 and len(index["files"]) == 4, index


def test_the_etcd_recipe_trains_on_two_nodes(cluster, tmp_path):
    """slurm/ddp-train-multinode-etcd.sbatch: both nodes rendezvous through a real etcd (one
    member, listening on loopback and on the test cluster's bridge, which the nodes' network
    namespaces reach) with --rdzv-backend=etcd-v3, and train with world size 4."""
    import subprocess
    import sys
    sys.path.insert(0, os.path.join(ROOT, "tests", "interop"))
    from etcd_cluster import EtcdCluster
    bridge = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", "ddpslbr0"],
                            capture_output=True, text=True).stdout.split()
    if "inet" not in bridge:
        pytest.fail("the test cluster's bridge ddpslbr0 has no address: " + " ".join(bridge))
    host = bridge[bridge.index("inet") + 1].split("/")[0]
    etcd = EtcdCluster(1, extra_hosts=[host])
    try:
        snap = str(tmp_path / "snap")
        port = etcd.client_ports[0]
        jid = cluster.sbatch(os.path.join(ROOT, "slurm", "ddp-train-multinode-etcd.sbatch"),
                             "--train-subset", "1024", "--batch-size", "64", "--no-eval",
                             env={"SNAPSHOT": snap, "EPOCHS": "1",
                                  "ETCD_ENDPOINTS": f"{host}:{port}"})
        state, code, log = cluster.wait(jid)
        assert (state, code) == ("COMPLETED", "0:0"), log + etcd.logs()
        assert re.search(r"world size 4, batch 64 per rank", log), log
        assert os.path.exists(snap)
        # The rounds' keys are in etcd, under the job's run id.
        import base64
        from etcd_cluster import post
        prefix = f"/ddprun/{jid}-0/"
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        got = post(etcd.endpoints[0], "kv/range",
                   {"key": base64.b64encode(prefix.encode()).decode(),
                    "range_end": base64.b64encode(end.encode()).decode(), "count_only": True})
        assert int(got.get("count", 0)) > 0, got
    finally:
        etcd.stop()
