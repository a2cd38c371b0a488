"""fsdp2_train: the PyTorch reference for `ddp-train --sharding ...`: the same mlp (784-H-...-H-10,
ReLU, softmax cross-entropy) from the same initial weights on the same data order, trained with
FSDP2 (torch.distributed.fsdp.fully_shard), torch DDP, or plain gradient all-reduce, on the CPU
over gloo.

Start it with torchrun or ddprun (it reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; without
RANK it is one process). Modes:
  fsdp2-full     fully_shard(reshard_after_forward=True) on every Linear, then on the root
                 (FSDP's FULL_SHARD, ZeRO-3)
  fsdp2-grad-op  the same with reshard_after_forward=False (SHARD_GRAD_OP, ZeRO-2)
  ddp            torch DistributedDataParallel (NO_SHARD)
  none           no wrapper: each gradient all-reduced and divided by the world size after
                 backward (nothing at world size 1)
Data order: ddp-train's sampler (ddp_format.shard_indices, SplitMix64(seed + epoch)), batches of
--batch-size per rank, the last one possibly short. Loss: each rank's batch mean; gradients
averaged over ranks (DDP and FSDP2 both do so). Optimizers: torch.optim.SGD (--momentum) and
Adam (betas 0.9, 0.999, eps 1e-8), as ddp-train's.

Weights: torch's own nn.Linear init from --seed, or --init-snapshot PATH (a DDPSNAP1 file). With
--write-init PATH rank 0 writes the initial weights as a fresh DDPSNAP1 snapshot (epoch 0, step
0, adam_t 0, zero optimizer state) that `ddp-train --snapshot COPY` starts from.

Timing as ddp-train's trainer.cpp: from the start of the training loop (after data loading,
setup and a barrier; the sampler's orders are computed before it) to the end of rank 0's loop;
samples_per_sec counts every rank's samples. --metrics-json (rank 0) holds step_losses (each
step's loss averaged over ranks, one all_reduce at the end, not per step), rank0_step_losses,
epoch_losses (rank 0's mean per completed epoch, as ddp-train's), final_loss, samples_per_sec,
train_seconds, param_checksum (FNV-1a 64 of the final parameters in ddp-train's flat layout) and
what the sharding looked like (fsdp: parameter types and rank 0's local element count).
--write-final PATH: rank 0 writes the final parameters and optimizer state as a DDPSNAP1
snapshot (in ddp-train's layout: SGD momentum buffer, or Adam m then v).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_format as fmt  # noqa: E402

MODES = ("fsdp2-full", "fsdp2-grad-op", "ddp", "none")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=MODES, default="fsdp2-full")
    p.add_argument("--hidden", type=int, default=0)
    p.add_argument("--layers", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--train-subset", type=int, default=0, help="first N training samples")
    p.add_argument("--data", default=fmt.FMNIST_DIR)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="stop after N optimizer steps")
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--momentum", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0, help="torch init and the sampler's shuffle")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--init-snapshot", help="start from this DDPSNAP1 file's parameters")
    p.add_argument("--write-init", help="rank 0 writes the initial weights here (DDPSNAP1)")
    p.add_argument("--write-final", help="rank 0 writes the final state here (DDPSNAP1)")
    p.add_argument("--metrics-json", help="rank 0 writes the run's figures here")
    p.add_argument("--no-checksum", action="store_true",
                   help="skip param_checksum (pure-Python FNV, ~0.3 s per MB of parameters)")
    a = p.parse_args(argv)
    if a.batch_size < 1 or a.threads < 1 or a.epochs < 0 or a.max_steps < 0 or a.train_subset < 0:
        p.error("--batch-size and --threads must be >= 1; --epochs, --max-steps, "
                "--train-subset >= 0")
    return a


def wrap(model, mode, world):
    """Applies the data-parallel wrapper; returns (the model to call, what it looks like)."""
    info = {"mode": mode}
    if mode in ("fsdp2-full", "fsdp2-grad-op"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor
        mesh = init_device_mesh("cpu", (world,))
        reshard = mode == "fsdp2-full"
        # FSDP2's recommended pattern: bottom-up, one group per layer, then the root.
        for lin in fmt.mlp_linears(model):
            fully_shard(lin, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        params = list(model.parameters())
        info["param_types"] = sorted({f"{type(p).__name__}{tuple(p.placements)}"
                                      if isinstance(p, DTensor) else type(p).__name__
                                      for p in params})
        info["local_numel"] = int(sum(p.to_local().numel() if isinstance(p, DTensor)
                                      else p.numel() for p in params))
        info["reshard_after_forward"] = reshard
        return model, info
    if mode == "ddp" and world > 1:
        from torch.nn.parallel import DistributedDataParallel
        info["local_numel"] = int(sum(p.numel() for p in model.parameters()))
        return DistributedDataParallel(model), info
    info["local_numel"] = int(sum(p.numel() for p in model.parameters()))
    return model, info


def make_optimizer(params, a):
    if a.optimizer == "adam":
        return torch.optim.Adam(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    return torch.optim.SGD(params, lr=a.lr, momentum=a.momentum)


def full(t):
    """A parameter or state tensor, whole (DTensor: all-gathered; a collective)."""
    from torch.distributed.tensor import DTensor
    if isinstance(t, DTensor):
        t = t.full_tensor()
    return t.detach().cpu().numpy().astype(np.float32)


def final_state(linears, opt, a):
    """(flat params, flat optimizer state) in ddp-train's layout; every rank must call it."""
    layers = [(full(lin.weight), full(lin.bias)) for lin in linears]
    flat = fmt.flat_from_layers(layers)

    def state(key):
        out = []
        for lin in linears:
            pair = []
            for p in (lin.weight, lin.bias):
                s = opt.state.get(p, {}).get(key)
                pair.append(full(s) if s is not None else np.zeros(tuple(p.shape), np.float32))
            out.append(tuple(pair))
        return fmt.flat_from_layers(out)

    if a.optimizer == "adam":
        opt_flat = np.concatenate([state("exp_avg"), state("exp_avg_sq")])
    elif a.momentum != 0.0:
        opt_flat = state("momentum_buffer")
    else:
        opt_flat = np.zeros(0, np.float32)
    return flat, opt_flat


def snapshot_header(a, world, epoch, step, global_step):
    return {"model": "mlp", "optimizer": a.optimizer, "epoch": epoch, "step": step,
            "global_step": global_step, "adam_t": global_step, "seed": a.seed, "lr": a.lr,
            "world_size": world, "batch_size": a.batch_size}


def main(argv=None):
    a = parse_args(argv)
    launched = "RANK" in os.environ
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(a.threads)
    if launched:
        dist.init_process_group("gloo")
    elif a.mode != "none":
        sys.exit(f"--mode {a.mode} needs a launcher (RANK and WORLD_SIZE in the environment)")

    dims = fmt.mlp_dims(a.hidden, a.layers)
    torch.manual_seed(a.seed)
    model = fmt.build_mlp(dims)
    if a.init_snapshot:
        header, params, _ = fmt.read_snapshot(a.init_snapshot)
        if header["model"] != "mlp":
            sys.exit(f"{a.init_snapshot}: model {header['model']!r}, not mlp")
        fmt.load_flat_into(model, params, dims)
    linears = fmt.mlp_linears(model)
    if a.write_init and rank == 0:
        init = fmt.flat_from_layers([(lin.weight.detach().numpy(), lin.bias.detach().numpy())
                                     for lin in linears])
        fmt.fresh_snapshot(a.write_init, init, optimizer=a.optimizer, momentum=a.momentum,
                           seed=a.seed, lr=a.lr, world_size=world, batch_size=a.batch_size)

    x_np, y_np = fmt.load_fashion_mnist(a.data, True, a.train_subset)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    n = x.shape[0]
    epochs = [[torch.from_numpy(b) for b in
               fmt.rank_batches(fmt.shard_indices(n, world, rank, a.seed, e), a.batch_size)]
              for e in range(a.epochs)]

    net, info = wrap(model, a.mode, world)
    opt = make_optimizer(net.parameters(), a)
    grads_by_hand = a.mode == "none" and world > 1

    if launched:
        dist.barrier()
    t0 = time.perf_counter()
    losses, epoch_losses = [], []
    steps = samples = 0
    pos = (0, 0)  # next epoch, next step in it
    for e, batches in enumerate(epochs):
        ep = []
        for s, b in enumerate(batches):
            loss = F.cross_entropy(net(x[b]), y[b])
            loss.backward()
            if grads_by_hand:
                for p in net.parameters():
                    dist.all_reduce(p.grad)
                    p.grad.div_(world)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.detach())
            ep.append(loss.detach())
            steps += 1
            samples += len(b) * world
            pos = (e, s + 1) if s + 1 < len(batches) else (e + 1, 0)
            if a.max_steps and steps >= a.max_steps:
                break
        if len(ep) == len(batches):
            epoch_losses.append(float(torch.stack(ep).double().mean()))
        if a.max_steps and steps >= a.max_steps:
            break
    secs = time.perf_counter() - t0

    own = torch.stack(losses) if losses else torch.zeros(0)
    mean = own.clone()
    if launched and world > 1 and mean.numel() > 0:
        dist.all_reduce(mean)
        mean /= world
    flat, opt_flat = final_state(linears, opt, a)
    if rank == 0:
        if a.write_final:
            fmt.write_snapshot(a.write_final, snapshot_header(a, world, pos[0], pos[1], steps),
                               flat, opt_flat)
        m = {"reference": "fsdp2_train", "torch": torch.__version__, "backend":
             dist.get_backend() if launched else "none", "world_size": world,
             "batch_size": a.batch_size, "hidden": a.hidden, "layers": a.layers,
             "params": int(flat.size), "optimizer": a.optimizer, "lr": a.lr,
             "momentum": a.momentum, "threads": a.threads, "steps": steps,
             "epochs_run": len(epoch_losses), "epoch_losses": epoch_losses,
             "step_losses": [float(v) for v in mean], "rank0_step_losses": [float(v) for v in own],
             "final_loss": float(own[-1]) if steps else 0.0, "train_seconds": secs,
             "samples_per_sec": samples / secs if secs > 0 else 0.0,
             "param_checksum": None if a.no_checksum else fmt.param_checksum(flat), **info}
        print(f"fsdp2_train: {a.mode} world {world}: {steps} steps in {secs:.2f} s, "
              f"{m['samples_per_sec']:.0f} samples/s, final loss {m['final_loss']:.4f}",
              flush=True)
        if a.metrics_json:
            with open(a.metrics_json, "w") as f:
                json.dump(m, f, indent=2)
                f.write("\n")
    if launched:
        # Every collective is done once the barrier returns. Leave without tearing gloo
        # down: torch 2.15 sometimes aborts a rank in that teardown ("terminate called
        # without an active exception", seen once in CI), which would fail a finished run.
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
