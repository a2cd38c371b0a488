"""PyTorch's examples/mnist main.py recipe, the anchor of `ddp-train --model convnet` (issue 19):
the same Net (conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, max-pool 2, dropout 0.25, fc
9216->128, ReLU, dropout 0.5, fc 128->10, log-softmax + NLL), Adadelta at --lr with StepLR
(step_size=1, gamma=--gamma) stepped after each epoch, batch 64, test batch 1000, shuffled each
epoch. Run on Fashion-MNIST (MNIST itself is not on these machines), read from the IDX gz files
with numpy and scaled to [0, 1] as ToTensor does; the example's Normalize((0.1307,), (0.3081,))
is left out because ddp-train does not normalise, so both sides see the same inputs.

Prints one JSON object: test_accuracy, samples_per_sec (training samples over training time,
the evaluation excluded), epoch_losses (each epoch's mean batch loss), train_seconds.

    python tests/reference/mnist_convnet_reference.py --train-subset 4000 --epochs 2 --threads 2
"""
import argparse
import gzip
import json
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR

FMNIST = "/usr/share/datasets/fashion-mnist"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def read_idx(folder, stem):
    """An IDX file of unsigned bytes, gzipped or plain, as a numpy array of its dimensions."""
    path = os.path.join(folder, stem)
    opener = gzip.open if os.path.exists(path + ".gz") else open
    with opener(path + ".gz" if opener is gzip.open else path, "rb") as f:
        data = f.read()
    if data[:3] != b"\x00\x00\x08":
        raise SystemExit(f"{path}: not an IDX file of unsigned bytes")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(folder, split, limit=0):
    """(images [n, 1, 28, 28] float32 in [0, 1], labels [n] int64): the first `limit` samples
    (0: all), as ddp-train's --train-subset takes them."""
    x = read_idx(folder, f"{split}-images-idx3-ubyte")
    y = read_idx(folder, f"{split}-labels-idx1-ubyte")
    if limit > 0:
        x, y = x[:limit], y[:limit]
    images = torch.from_numpy(x.astype(np.float32) / np.float32(255.0)).unsqueeze(1)
    return images, torch.from_numpy(y.astype(np.int64))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=FMNIST)
    ap.add_argument("--train-subset", type=int, default=0, help="first N training samples")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--test-batch-size", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--gamma", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if not 1 <= args.epochs <= 1000 or not 1 <= args.batch_size <= 65536 \
            or not 1 <= args.threads <= 1024 or args.train_subset < 0:
        raise SystemExit("--epochs, --batch-size, --threads or --train-subset out of range")

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    x_train, y_train = load(args.data, "train", args.train_subset)
    x_test, y_test = load(args.data, "t10k")
    model = Net()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    n = len(x_train)
    epoch_losses, train_seconds = [], 0.0
    for _ in range(args.epochs):
        model.train()
        order = torch.randperm(n)  # DataLoader(shuffle=True)
        t0 = time.perf_counter()
        total, steps = 0.0, 0
        for first in range(0, n, args.batch_size):
            idx = order[first:first + args.batch_size]
            optimizer.zero_grad()
            loss = F.nll_loss(model(x_train[idx]), y_train[idx])
            loss.backward()
            optimizer.step()
            total += loss.item()
            steps += 1
        train_seconds += time.perf_counter() - t0
        epoch_losses.append(total / steps)
        scheduler.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for first in range(0, len(x_test), args.test_batch_size):
            out = model(x_test[first:first + args.test_batch_size])
            correct += int((out.argmax(dim=1) == y_test[first:first + args.test_batch_size]).sum())
    print(json.dumps({
        "test_accuracy": correct / len(x_test),
        "samples_per_sec": n * args.epochs / train_seconds,
        "epoch_losses": epoch_losses,
        "train_seconds": train_seconds,
        "train_samples": n,
        "epochs": args.epochs,
        "threads": args.threads,
    }))


if __name__ == "__main__":
    main()
