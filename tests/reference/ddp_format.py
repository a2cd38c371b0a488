"""ddp_format: ddp-train's data formats and conventions in Python, for PyTorch references that
must train the same model from the same weights on the same data order as ddp-train.

- DDPSNAP1 snapshots (docs/ddp_train.md "Snapshots", worker_runtime/train/snapshot/snapshot.cpp):
  read_snapshot / write_snapshot / fresh_snapshot, FNV-1a 64 (fnv1a64).
- The sampler (worker_runtime/train/model/sampler.cpp): SplitMix64(seed + epoch) Fisher-Yates, padded
  to a multiple of the world size by repeating the start, rank r takes positions r, r + W, ...
  (shard_indices), and its batches (rank_batches).
- Fashion-MNIST from the IDX files, gzipped or not, pixels * (1/255) in float32 as data.cpp
  computes them (load_fashion_mnist).
- The mlp's shape (mlp_dims: 784-H-...-H-10) and the flat parameter layout: the LAST layer first,
  each layer's weight [out][in] then its bias (flat_from_layers / layers_from_flat), plus the
  torch nn.Sequential that matches (build_mlp, mlp_linears).

Only numpy is needed to import this module; torch is imported lazily by the torch helpers.
"""
import gzip
import json
import os
import struct

import numpy as np

MAGIC = b"DDPSNAP1"
FNV_OFFSET, FNV_PRIME, U64 = 0xcbf29ce484222325, 0x100000001b3, (1 << 64) - 1
FMNIST_DIR = "/usr/share/datasets/fashion-mnist"
HEADER_KEYS = ("model", "params", "optimizer", "opt_state", "epoch", "step", "global_step",
               "seed", "lr", "adam_t", "world_size", "batch_size")


# ----------------------------------------------------------------------------------- checksums

def fnv1a64(data, h=FNV_OFFSET):
    """FNV-1a 64 of a bytes-like object (snapshot.cpp's fnv1a64). Pure Python: about 0.3 s per
    MB, fine for test-sized models."""
    for b in bytes(data):
        h = ((h ^ b) * FNV_PRIME) & U64
    return h


def param_checksum(flat):
    """--metrics-json's param_checksum: FNV-1a 64 of the f32 parameter bytes, 16 hex digits."""
    return f"{fnv1a64(np.ascontiguousarray(flat, dtype='<f4').tobytes()):016x}"


# ----------------------------------------------------------------------------------- snapshots

def encode_snapshot(header, params, opt_state):
    """The bytes of a DDPSNAP1 file. `header` needs every key of HEADER_KEYS except params and
    opt_state, which are taken from the arrays' sizes."""
    params = np.ascontiguousarray(params, dtype="<f4").ravel()
    opt_state = np.ascontiguousarray(opt_state, dtype="<f4").ravel()
    h = dict(header)
    h["params"] = int(params.size)
    h["opt_state"] = int(opt_state.size)
    missing = [k for k in HEADER_KEYS if k not in h]
    if missing:
        raise ValueError(f"snapshot header lacks {missing}")
    text = json.dumps(h, separators=(",", ":")).encode()
    body = MAGIC + struct.pack("<I", len(text)) + text + params.tobytes() + opt_state.tobytes()
    return body + struct.pack("<Q", fnv1a64(body))


def write_snapshot(path, header, params, opt_state):
    """Writes the snapshot atomically (temporary file in the same folder, fsync, rename)."""
    data = encode_snapshot(header, params, opt_state)
    tmp = os.path.join(os.path.dirname(os.path.abspath(path)),
                       f".{os.path.basename(path)}.tmp.{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_snapshot(path):
    """Parses and checks a DDPSNAP1 file (magic, header, sizes, FNV-1a 64 trailer) as
    snapshot.cpp's decode_snapshot does. Returns (header dict, params, opt_state): float32."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 20 or data[:8] != MAGIC:
        raise ValueError(f"{path}: not a ddp-train snapshot (no DDPSNAP1 magic)")
    (stored,) = struct.unpack_from("<Q", data, len(data) - 8)
    if fnv1a64(data[:-8]) != stored:
        raise ValueError(f"{path}: checksum mismatch (truncated or corrupt file)")
    (hlen,) = struct.unpack_from("<I", data, 8)
    if 12 + hlen + 8 > len(data):
        raise ValueError(f"{path}: header length {hlen} runs past the end")
    header = json.loads(data[12:12 + hlen].decode())
    missing = [k for k in HEADER_KEYS if k not in header]
    if missing:
        raise ValueError(f"{path}: header lacks {missing}")
    n, m = int(header["params"]), int(header["opt_state"])
    off = 12 + hlen
    if off + 4 * (n + m) + 8 != len(data):
        raise ValueError(f"{path}: the header says {n} + {m} floats, the file holds "
                         f"{len(data) - off - 8} bytes")
    params = np.frombuffer(data, dtype="<f4", count=n, offset=off).astype(np.float32)
    opt = np.frombuffer(data, dtype="<f4", count=m, offset=off + 4 * n).astype(np.float32)
    return header, params, opt


def opt_state_size(optimizer, momentum, params):
    """Floats of optimizer state ddp-train keeps (optimizer.cpp): Adam m and v; SGD a momentum
    buffer only when momentum != 0."""
    if optimizer == "adam":
        return 2 * params
    if optimizer == "sgd":
        return params if momentum != 0.0 else 0
    raise ValueError(f"unknown optimizer {optimizer!r}")


def fresh_snapshot(path, params, *, optimizer, momentum, seed, lr, world_size, batch_size,
                   model="mlp"):
    """A snapshot that ddp-train resumes as a fresh start from these weights: epoch 0, step 0,
    global_step 0, adam_t 0 and zero optimizer state (SGD's first step then sets its momentum
    buffer to the gradient, as torch's does)."""
    params = np.asarray(params, dtype=np.float32).ravel()
    header = {"model": model, "optimizer": optimizer, "epoch": 0, "step": 0, "global_step": 0,
              "adam_t": 0, "seed": int(seed), "lr": float(lr), "world_size": int(world_size),
              "batch_size": int(batch_size)}
    zeros = np.zeros(opt_state_size(optimizer, momentum, params.size), dtype=np.float32)
    write_snapshot(path, header, params, zeros)


# ------------------------------------------------------------------------------------ sampler

class SplitMix64:
    """data.hpp's SplitMix64: the trainer's only random source."""

    def __init__(self, seed):
        self.state = seed & U64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & U64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
        return z ^ (z >> 31)


def shard_indices(n, world, rank, seed, epoch, shuffle=True):
    """sampler.cpp's shard_indices: this rank's sample indices for the epoch."""
    order = list(range(n))
    if shuffle:
        rng = SplitMix64(seed + epoch)
        for i in range(n, 1, -1):
            j = rng.next() % i
            order[i - 1], order[j] = order[j], order[i - 1]
    per_rank = (n + world - 1) // world
    total = per_rank * world
    if n > 0:
        order += [order[i - n] for i in range(n, total)]
    return np.asarray(order[rank::world], dtype=np.int64)


def rank_batches(idx, batch_size):
    """The epoch's batches of a rank's indices, as trainer.cpp cuts them (the last may be
    short)."""
    return [idx[i:i + batch_size] for i in range(0, len(idx), batch_size)]


def steps_per_epoch(n, world, batch_size):
    per_rank = (n + world - 1) // world
    return (per_rank + batch_size - 1) // batch_size


# --------------------------------------------------------------------------------------- data

def read_idx(path):
    """An unsigned-byte IDX file, gzipped or not (gzip is recognised by its magic)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    ndim = raw[3]
    dims = [int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise ValueError(f"{path}: IDX data has {data.size} bytes, the header says {dims}")
    return data.reshape(dims)


def _find(dir_, stem):
    for ext in (".gz", ""):
        p = os.path.join(dir_, stem + ext)
        if os.path.exists(p):
            return p
    raise FileNotFoundError(f"{dir_}: {stem}[.gz] is missing")


def load_fashion_mnist(dir_=FMNIST_DIR, train=True, limit=0):
    """(x [n][784] float32 = byte * float32(1/255) as data.cpp does, labels [n] int64)."""
    split = "train" if train else "t10k"
    images = read_idx(_find(dir_, f"{split}-images-idx3-ubyte"))
    labels = read_idx(_find(dir_, f"{split}-labels-idx1-ubyte"))
    n = images.shape[0] if limit <= 0 else min(limit, images.shape[0])
    x = images[:n].reshape(n, -1).astype(np.float32) * np.float32(1.0 / 255.0)
    return x, labels[:n].astype(np.int64)


# ------------------------------------------------------------------------------- flat layout

def mlp_dims(hidden=0, layers=0):
    """model.cpp's model_spec(mlp, hidden, layers): [(in, out)] of each Linear, in forward
    order. 0 for both is the default 784-256-128-10; 0 for one keeps the other's default
    (256 units, 2 layers)."""
    if hidden == 0 and layers == 0:
        return [(784, 256), (256, 128), (128, 10)]
    width = hidden or 256
    depth = layers or 2
    dims, fan = [], 784
    for _ in range(depth):
        dims.append((fan, width))
        fan = width
    dims.append((fan, 10))
    return dims


def param_count(dims):
    return sum(i * o + o for i, o in dims)


def flat_from_layers(layers):
    """[(weight [out][in], bias [out])] in forward order -> the flat f32 layout (last layer
    first, weight then bias)."""
    parts = []
    for w, b in reversed(layers):
        parts += [np.asarray(w, dtype=np.float32).ravel(), np.asarray(b, dtype=np.float32).ravel()]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def layers_from_flat(flat, dims):
    """The inverse of flat_from_layers: [(weight [out][in], bias [out])] in forward order."""
    flat = np.asarray(flat, dtype=np.float32).ravel()
    if flat.size != param_count(dims):
        raise ValueError(f"{flat.size} floats; the mlp {dims} has {param_count(dims)}")
    out, off = [None] * len(dims), 0
    for k in range(len(dims) - 1, -1, -1):
        fan_in, fan_out = dims[k]
        w = flat[off:off + fan_in * fan_out].reshape(fan_out, fan_in)
        off += fan_in * fan_out
        b = flat[off:off + fan_out]
        off += fan_out
        out[k] = (w, b)
    return out


def build_mlp(dims):
    """torch's nn.Sequential for the mlp: Linear, ReLU, ..., Linear (torch's default init)."""
    from torch import nn
    mods = []
    for k, (i, o) in enumerate(dims):
        mods.append(nn.Linear(i, o))
        if k + 1 < len(dims):
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def mlp_linears(model):
    """The model's Linear layers in forward order."""
    from torch import nn
    return [m for m in model.modules() if isinstance(m, nn.Linear)]


def load_flat_into(model, flat, dims):
    """Copies flat-layout weights into the (unsharded) torch mlp."""
    import torch
    linears = mlp_linears(model)
    with torch.no_grad():
        for lin, (w, b) in zip(linears, layers_from_flat(flat, dims)):
            lin.weight.copy_(torch.from_numpy(np.array(w)))
            lin.bias.copy_(torch.from_numpy(np.array(b)))
