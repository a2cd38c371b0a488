"""llama_spec: ddp-train's LLaMA-style model and its text in numpy, for the PyTorch reference
(llama_reference.py) and for tests: what worker_runtime/train/lm/lm_spec.hpp and lm_data.hpp say,
computed the same way.

- splitmix64 (vectorised over numpy uint64, wrapping) and the counter-based initial values
  (init_values: tensor j's canonical elements from seed ^ (0x5851F42D4C957F2D (j + 1)), Box-Muller
  in float64, clipped to [-3, 3] where the tensor clips, value = float32(float32(std) * z)).
- The tensors in canonical order (tensors): name, canonical shape [rows, cols], std, clip, and
  whether canonical storage is torch's weight transposed (wo and w2: [in][out]).
- The text (load_corpus: a file, or a folder's regular files without '.' in name order; the last
  floor(n val_fraction) bytes are validation text), the sequence starts of every step
  (sequence_start), a rank's batch (batch), the validation windows (val_windows) and the unigram
  baseline (unigram_baseline).

Only numpy is needed.
"""
import math
import os
from dataclasses import dataclass

import numpy as np

U64 = np.uint64
DEFAULT_TEXT = "/usr/share/games/fortunes"
MAX_TEXT_BYTES = 1 << 30


def splitmix64(x):
    """splitmix64 of a uint64 scalar or array (one step of Steele et al.'s generator)."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=U64) + U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> U64(30))) * U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> U64(27))) * U64(0x94D049BB133111EB)
        return z ^ (z >> U64(31))


def mul64(a, b):
    """(a * b) mod 2^64 for Python ints."""
    return (int(a) * int(b)) & ((1 << 64) - 1)


# ----------------------------------------------------------------------------------- the model

@dataclass
class LmConfig:
    vocab: int = 256
    dim: int = 256
    n_layers: int = 2
    n_heads: int = 16
    ffn_hidden: int = 0  # 0: LLaMA's rule (ffn())
    seq_len: int = 128
    tied: bool = False
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self):
        return self.dim // self.n_heads

    def ffn(self):
        if self.ffn_hidden:
            return self.ffn_hidden
        h = 2 * (4 * self.dim) // 3
        return 256 * ((h + 255) // 256)


@dataclass
class Tensor:
    name: str
    rows: int
    cols: int
    std: float = 0.0
    clip: bool = True
    ones: bool = False
    transposed: bool = False  # canonical [rows][cols] = torch's weight transposed


def tensors(c):
    """lm_tensors(c): the tensors in canonical order."""
    d, f = c.dim, c.ffn()
    out = [Tensor("tok_embeddings.weight", c.vocab, d, std=1.0, clip=False)]
    for layer in range(c.n_layers):
        p = f"layers.{layer}."
        deep = 0.02 / math.sqrt(2.0 * (layer + 1))
        out += [Tensor(p + "attention_norm.weight", 1, d, ones=True),
                Tensor(p + "attention.wq.weight", d, d, std=0.02),
                Tensor(p + "attention.wk.weight", d, d, std=0.02),
                Tensor(p + "attention.wv.weight", d, d, std=0.02),
                Tensor(p + "attention.wo.weight", d, d, std=deep, transposed=True),
                Tensor(p + "ffn_norm.weight", 1, d, ones=True),
                Tensor(p + "feed_forward.w1.weight", f, d, std=0.02),
                Tensor(p + "feed_forward.w3.weight", f, d, std=deep),
                Tensor(p + "feed_forward.w2.weight", f, d, std=deep, transposed=True)]
    out.append(Tensor("norm.weight", 1, d, ones=True))
    if not c.tied:
        out.append(Tensor("output.weight", c.vocab, d, std=1.0 / math.sqrt(d)))
    return out


def init_values(seed, j, t, lo=0, hi=None):
    """Canonical elements [lo, hi) of tensor j (Tensor t) for `seed`, float32 (lm_init_slice)."""
    hi = t.rows * t.cols if hi is None else hi
    if t.ones:
        return np.ones(hi - lo, np.float32)
    base = splitmix64(U64((int(seed) & ((1 << 64) - 1)) ^ mul64(0x5851F42D4C957F2D, j + 1)))
    with np.errstate(over="ignore"):
        i2 = base + U64(2) * np.arange(lo, hi, dtype=U64)
        h1, h2 = splitmix64(i2), splitmix64(i2 + U64(1))
    u1 = ((h1 >> U64(11)).astype(np.float64) + 0.5) / 2.0 ** 53
    u2 = (h2 >> U64(11)).astype(np.float64) / 2.0 ** 53
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)
    if t.clip:
        z = np.clip(z, -3.0, 3.0)
    return (np.float64(np.float32(t.std)) * z).astype(np.float32)


# ------------------------------------------------------------------------------------ the text

def text_files(path):
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--text {path}: no such file or folder")
    names = sorted((n for n in os.listdir(path)
                    if "." not in n and os.path.isfile(os.path.join(path, n))),
                   key=lambda n: n.encode())
    if not names:
        raise ValueError(f"--text {path}: the folder holds no text file")
    return [os.path.join(path, n) for n in names]


def load_corpus(path, val_fraction, seq_len):
    """(train bytes, val bytes, files) as numpy uint8 arrays (load_corpus)."""
    if not 0.0 < val_fraction <= 0.5:
        raise ValueError(f"--val-fraction {val_fraction}: must be in (0, 0.5]")
    files = text_files(path)
    parts = []
    for f in files:
        with open(f, "rb") as fh:
            parts.append(fh.read())
    data = b"".join(parts)
    if len(data) > MAX_TEXT_BYTES:
        raise ValueError(f"--text {path}: {len(data)} bytes exceed {MAX_TEXT_BYTES}")
    n = len(data)
    n_val = int(float(n) * val_fraction)
    n_train = n - n_val
    if min(n_train, n_val) < 2 * (seq_len + 1):
        raise ValueError(f"--text {path}: too small ({n_train} training, {n_val} validation "
                         f"bytes; each side needs {2 * (seq_len + 1)})")
    arr = np.frombuffer(data, np.uint8)
    return arr[:n_train].copy(), arr[n_train:].copy(), files


def sequence_start(seed, step, g, train_size, seq_len):
    """First token of sequence(s) g (int or array) of global step `step` (sequence_start)."""
    m = (1 << 64) - 1
    key = splitmix64(U64((mul64((int(seed) + 1) & m, 0xD1B54A32D192ED03) + (int(step) & m)) & m))
    with np.errstate(over="ignore"):
        h = splitmix64(key + np.asarray(g, dtype=U64))
    return (h % U64(train_size - seq_len - 1)).astype(np.int64)


def batch(train, seed, step, g0, count, seq_len):
    """Inputs and targets [count, seq_len] (int64) of sequences [g0, g0 + count) of `step`."""
    starts = sequence_start(seed, step, np.arange(g0, g0 + count), train.size, seq_len)
    idx = starts[:, None] + np.arange(seq_len)[None, :]
    return train[idx].astype(np.int64), train[idx + 1].astype(np.int64)


def val_windows(val, seq_len, max_windows):
    """Inputs and targets [n, seq_len] (int64) of the validation windows."""
    n = min(max_windows, (val.size - 1) // seq_len) if val.size else 0
    idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len)[None, :]
    return val[idx].astype(np.int64), val[idx + 1].astype(np.int64)


def unigram_baseline(train, val, seq_len, max_windows):
    """Nats per byte of the validation targets under add-one-smoothed training byte counts."""
    counts = np.bincount(train, minlength=256).astype(np.float64)
    nll = -np.log((counts + 1.0) / (train.size + 256.0))
    _, targets = val_windows(val, seq_len, max_windows)
    return float(nll[targets].mean())
