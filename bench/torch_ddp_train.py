"""torch_ddp_train: PyTorch DDP equivalent of `ddp-train --model mlp --dataset fashion-mnist`.

Same model (Linear(784,256) ReLU Linear(256,128) ReLU Linear(128,10), cross-entropy), same data
(the gzipped Fashion-MNIST IDX files, pixels / 255), DistributedSampler(shuffle=True, seed) with
a DataLoader of --batch-size samples per rank, DistributedDataParallel over gloo, SGD or Adam.
Start it with torchrun (env://). Only the training loop is timed (from a barrier to a barrier);
then rank 0 evaluates test accuracy on the 10000 test images and writes --metrics-json
{"samples_per_sec", "train_seconds", "test_accuracy", "epochs_run", "world_size", "batch_size",
...}, samples_per_sec counting the samples of all ranks. Usually run by bench/run_train_bench.sh.
"""
import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD momentum")
    p.add_argument("--seed", type=int, default=0, help="initialisation and sampler shuffle")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--train-subset", type=int, default=0, help="first N training samples (0: all)")
    p.add_argument("--data", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    p.add_argument("--batched-loader", action="store_true",
                   help="fetch each batch with one indexing op (a BatchSampler as the sampler) "
                        "instead of the usual per-sample fetch and collate")
    p.add_argument("--metrics-json", type=Path, help="rank 0 writes the run's figures here")
    p.add_argument("--checkpoint", type=Path,
                   help="the seeds' recipe: rank 0 saves model and optimizer here after every "
                        "epoch, and a (re)started run resumes from it (bench/recovery_bench.py)")
    p.add_argument("--kill-at", default="",
                   help="RANK:STEP: that rank SIGKILLs itself at that global step, first "
                        "attempt only (TORCHELASTIC_RESTART_COUNT=0), as DDP_TRAIN_FAULT")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: the model on LOCAL_RANK's GPU (or the only one), DDP over nccl")
    args = p.parse_args()
    if args.batch_size < 1 or args.epochs < 0 or args.threads < 1 or args.train_subset < 0:
        p.error("--batch-size and --threads must be >= 1, --epochs and --train-subset >= 0")
    return args


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzipped or not): big-endian magic (0, 0, type, ndim), dims, then data."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4).astype(np.int64)
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {data.size} bytes of data for dims {dims.tolist()}")
    return data.reshape(dims)


def load_split(folder: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    def find(stem: str) -> Path:
        for name in (stem + ".gz", stem):
            if (folder / name).exists():
                return folder / name
        raise FileNotFoundError(f"{folder / stem}(.gz) not found")

    images = read_idx(find(f"{split}-images-idx3-ubyte"))
    labels = read_idx(find(f"{split}-labels-idx1-ubyte"))
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32) / 255.0)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def main() -> int:
    args = parse_args()
    torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo")  # env:// from torchrun
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", 0 if torch.cuda.device_count() == 1 else local)
        torch.cuda.set_device(device)

    x, y = load_split(args.data, "train")
    if args.train_subset:
        x, y = x[:args.train_subset], y[:args.train_subset]
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True,
                                 seed=args.seed, drop_last=False)
    if args.batched_loader:
        from torch.utils.data import BatchSampler
        loader = DataLoader(dataset, sampler=BatchSampler(sampler, args.batch_size, False),
                            batch_size=None, num_workers=0)
    else:
        loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler,
                            num_workers=0)

    torch.manual_seed(args.seed)
    # DDP broadcasts rank 0's parameters.
    model = DistributedDataParallel(make_model().to(device),
                                    device_ids=[device.index] if cuda else None)
    if args.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()

    first_epoch = 0
    if args.checkpoint and args.checkpoint.exists():  # every rank reads it (one host here)
        state = torch.load(args.checkpoint, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        first_epoch = int(state["epoch"])
        if rank == 0:
            print(f"resumed from {args.checkpoint} at epoch {first_epoch}", file=sys.stderr,
                  flush=True)
    kill_rank, kill_step = (int(v) for v in args.kill_at.split(":")) if args.kill_at else (-1, -1)
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        kill_rank = -1
    samples, steps, epoch_losses = 0, 0, []
    dist.barrier()
    start = time.perf_counter()
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        loss_sum, batches = 0.0, 0
        for xb, yb in loader:
            if cuda:
                xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            if rank == kill_rank and epoch * len(loader) + batches == kill_step:
                os.kill(os.getpid(), 9)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            loss_sum += loss.item()
            batches += 1
            samples += len(yb)
        steps += batches
        epoch_losses.append(loss_sum / max(batches, 1))
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} mean loss {epoch_losses[-1]:.4f}",
                  file=sys.stderr, flush=True)
            if args.checkpoint:
                tmp = args.checkpoint.with_suffix(".tmp")
                torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                            "epoch": epoch + 1}, tmp)
                os.replace(tmp, args.checkpoint)
    dist.barrier()
    train_seconds = time.perf_counter() - start

    total = torch.tensor([samples], dtype=torch.int64, device=device)
    dist.all_reduce(total)
    if rank == 0:
        xt, yt = load_split(args.data, "t10k")
        xt, yt = xt.to(device), yt.to(device)
        model.module.eval()
        with torch.no_grad():
            correct = sum(int((model.module(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum())
                          for i in range(0, len(xt), 1000))
        accuracy = correct / len(xt)
        metrics = {
            "model": "mlp", "dataset": "fashion-mnist", "framework": f"torch {torch.__version__}",
            "world_size": world, "batch_size": args.batch_size, "epochs_run": args.epochs,
            "steps": steps, "samples": int(total.item()), "train_seconds": train_seconds,
            "samples_per_sec": int(total.item()) / train_seconds if train_seconds > 0 else 0.0,
            "test_accuracy": accuracy, "epoch_losses": epoch_losses,
            "final_loss": epoch_losses[-1] if epoch_losses else None,
            "optimizer": args.optimizer, "lr": args.lr, "threads": args.threads,
            "loader": "batched" if args.batched_loader else "per-sample",
            "device": str(device),
        }
        print(f"samples/s {metrics['samples_per_sec']:.0f} train {train_seconds:.2f} s "
              f"test accuracy: {accuracy:.4f}", file=sys.stderr, flush=True)
        if args.metrics_json:
            args.metrics_json.write_text(json.dumps(metrics, indent=2) + "\n")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
