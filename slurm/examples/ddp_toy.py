"""An ordinary PyTorch DDP script, written for torchrun and run unchanged by ddprun.

It reads torchrun's environment, trains a small model on random data with DDP (nccl on GPUs,
gloo otherwise) and prints, from every rank, one line the Slurm tests and the start-up
benchmark read:
  ddp_toy: rank R/W local_rank L node NODE first_step_unix T
and at the end, from rank 0: ddp_toy: done steps S checksum C
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 1)).to(device),
                device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, 20, generator=gen).to(device)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 0:
            print(f"ddp_toy: rank {rank}/{world} local_rank {local_rank} node {socket.gethostname()}"
                  f" first_step_unix {time.time():.3f}", flush=True)
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    if rank == 0:
        print(f"ddp_toy: done steps {args.steps} checksum {checksum:.6f}", flush=True)
    # Every rank done before any tears its connections down: torch's gloo backend can abort a
    # rank ("terminate called without an active exception") whose peer destroys the group
    # while it is still finishing (seen with torch 2.15).
    dist.barrier()
    dist.destroy_process_group()
    # And torch 2.15's gloo can still abort at interpreter exit, after all of the above (1 run
    # in 12 to 40 on 2 ranks, under torchrun too): the work is done and printed, so leave
    # without the interpreter's teardown.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
