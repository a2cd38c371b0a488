"""llama_reference: the PyTorch reference for `ddp-train --model llama`: the LLaMA-style decoder of
worker_runtime/train/lm/lm_spec.hpp (the seed's llama2_model.py at byte vocabulary) from the same
initial values, on the same batches of the same text (lm_data.hpp), trained with tensor
parallelism and FSDP2 on a 2-D mesh on the CPU over gloo.

Start it with torchrun or ddprun (it reads RANK and WORLD_SIZE; without RANK it is one process).
--mesh dp=D,tp=T (default dp=world,tp=1) builds init_device_mesh("cpu", (D, T), ("dp", "tp")).
Tensor parallelism (T > 1), the seed's fsdp_tp_example.py without sequence parallelism:
parallelize_module on the tp mesh with attention.wq/wk/wv and feed_forward.w1/w3 ColwiseParallel,
attention.wo and feed_forward.w2 RowwiseParallel, output ColwiseParallel(output_layouts=
Replicate()) (not when tied); the embedding and norms stay replicated; each attention module runs
n_heads // T local heads. Data parallelism (D > 1): --sharding full (FSDP2 fully_shard,
reshard_after_forward=True, on every TransformerBlock then the root, over the dp mesh),
gradients and optimizer (the same with reshard_after_forward=False: FSDP2 has no ZeRO-1, the
arithmetic is the same), none (each gradient all-reduced over dp and divided by D).

Data: the global batch of step s is sequences g < D * --batch-size drawn by
llama_spec.sequence_start; dp rank d takes [d b, (d + 1) b). Loss: mean cross-entropy over the
rank's tokens; gradients averaged over dp, so each step minimises the global batch's mean.
Optimizers: Adam (betas 0.9, 0.999, eps 1e-8, no weight decay), AdamW (--weight-decay, on every
parameter), SGD (--momentum).

--out FILE.json (rank 0): step_losses (each step's loss averaged over the dp ranks), final_loss,
val_loss (mean cross-entropy of --eval-seqs validation windows, after training), unigram_baseline,
elapsed_seconds (the training loop), tokens_per_sec (global tokens over steps 2..N divided by
their time), and the final canonical parameters' fingerprint: param_sum, param_sumsq (float64 over
lm_spec's canonical order, wo and w2 transposed; also as fingerprint: [sum, sumsq], ddp-train's
key) and param_absmax. --write-params PATH: rank 0 writes that canonical vector as raw
little-endian float32 (--steps 0: the initial values).
"""
import argparse
import json
import logging
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_spec as spec  # noqa: E402

SHARDINGS = ("full", "gradients", "optimizer", "none")
# FSDP2 warns that the root returns a view (nothing here writes into it in place), DTensor that
# gathering a 2-D-sharded tensor at the end takes two all-gathers.
warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


# ---------------------------------------------------------------- the model (llama2_model.py)

def precompute_freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)  # complex64 [end, dim / 2]


def apply_rotary_emb(xq, xk, freqs_cis):
    """Rotates interleaved pairs (x[2i], x[2i + 1]) of every head by position * freq_i."""
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        out = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_heads = c.n_heads  # divided by tp once tensor parallelism cuts wq, wk, wv
        self.head_dim = c.head_dim
        self.wq = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)

    def forward(self, x, freqs_cis):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        out = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2),
                                             xv.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).contiguous().view(bsz, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attention = Attention(c)
        self.feed_forward = FeedForward(c.dim, c.ffn())
        self.attention_norm = RMSNorm(c.dim, c.norm_eps)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok_embeddings = nn.Embedding(c.vocab, c.dim)
        self.layers = nn.ModuleList(TransformerBlock(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab, bias=False)
        if c.tied:
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer("freqs_cis", precompute_freqs_cis(c.head_dim, c.seq_len,
                                                               c.rope_theta), persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[: tokens.shape[1]]
        for layer in self.layers:
            h = layer(h, freqs_cis)
        return self.output(self.norm(h)).float()


def load_canonical_init(model, c, seed):
    """Copies lm_init_slice's values into torch's weights (woT and w2T transposed back)."""
    params = dict(model.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for j, t in enumerate(spec.tensors(c)):
            v = spec.init_values(seed, j, t).reshape(t.rows, t.cols)
            p = params[t.name]
            p.copy_(torch.from_numpy(np.ascontiguousarray(v.T if t.transposed else v))
                    .reshape(p.shape))


def canonical_flat(model, c):
    """The parameters in lm_spec's canonical order, whole (DTensors gathered: collective)."""
    from torch.distributed.tensor import DTensor
    params = dict(model.named_parameters(remove_duplicate=False))
    out = []
    for t in spec.tensors(c):
        p = params[t.name].detach()
        if isinstance(p, DTensor):
            p = p.full_tensor()
        v = p.cpu().numpy().astype(np.float32).reshape(-1)
        if t.transposed:
            v = v.reshape(t.cols, t.rows).T.reshape(-1)
        out.append(v)
    return np.concatenate(out)


# ------------------------------------------------------------------------------- parallelism

def parse_mesh(text, world):
    if not text:
        return world, 1
    parts = dict(kv.split("=", 1) for kv in text.split(","))
    if set(parts) - {"dp", "tp"}:
        sys.exit(f"--mesh {text}: expected dp=D,tp=T")
    tp = int(parts.get("tp", 1))
    dp = int(parts.get("dp", world // tp if tp > 0 else 0))
    if dp < 1 or tp < 1 or dp * tp != world:
        sys.exit(f"--mesh {text}: dp * tp must be the world size {world}")
    return dp, tp


def parallelize(model, c, a, dp, tp):
    """Applies TP and FSDP2; returns (the dp process group or None, what it looks like)."""
    info = {"mesh": {"dp": dp, "tp": tp}, "sharding": a.sharding if dp > 1 else "none"}
    if dp * tp == 1:
        return None, info
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    dp_mesh, tp_mesh = mesh["dp"], mesh["tp"]
    info["dp_rank"] = dp_mesh.get_local_rank()
    if tp > 1:
        from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                       parallelize_module)
        if not c.tied:
            parallelize_module(model, tp_mesh,
                               {"output": ColwiseParallel(output_layouts=Replicate())})
        for block in model.layers:
            block.attention.n_heads = block.attention.n_heads // tp_mesh.size()
            parallelize_module(block, tp_mesh, {
                "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
                "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel()})
    group = None
    if dp > 1 and a.sharding != "none":
        from torch.distributed.fsdp import fully_shard
        reshard = a.sharding == "full"
        for block in model.layers:
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard)
        info["reshard_after_forward"] = reshard
    elif dp > 1:
        group = dp_mesh.get_group()
    from torch.distributed.tensor import DTensor
    params = list(model.parameters())
    info["param_types"] = sorted({f"{type(p).__name__}{tuple(p.placements)}"
                                  if isinstance(p, DTensor) else type(p).__name__
                                  for p in params})
    info["local_numel"] = int(sum(p.to_local().numel() if isinstance(p, DTensor)
                                  else p.numel() for p in params))
    return group, info


def average_grads(model, group, dp):
    """--sharding none at dp > 1: every gradient all-reduced over dp and divided by dp."""
    from torch.distributed.tensor import DTensor
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(g, group=group)
                g.div_(dp)


def make_optimizer(params, a):
    if a.optimizer == "adam":
        return torch.optim.Adam(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
    if a.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                                 weight_decay=a.weight_decay)
    return torch.optim.SGD(params, lr=a.lr, momentum=a.momentum)


# ------------------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=16)
    p.add_argument("--ffn-hidden", type=int, default=0, help="0: LLaMA's rule")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--tie-embeddings", action="store_true")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per dp rank per step")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0, help="initial values and batches")
    p.add_argument("--text", default=spec.DEFAULT_TEXT)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--eval-seqs", type=int, default=64, help="validation windows (0: none)")
    p.add_argument("--mesh", default="", help="dp=D,tp=T (default dp=world,tp=1)")
    p.add_argument("--sharding", choices=SHARDINGS, default="full", help="at dp > 1")
    p.add_argument("--optimizer", choices=("adam", "adamw", "sgd"), default="adamw")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD's")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--out", help="rank 0 writes the run's figures here (JSON)")
    p.add_argument("--write-params", help="rank 0 writes the final canonical float32 vector")
    a = p.parse_args(argv)
    if min(a.dim, a.n_layers, a.n_heads, a.seq_len, a.batch_size, a.threads) < 1 or \
            a.steps < 0 or a.eval_seqs < 0 or a.ffn_hidden < 0:
        p.error("sizes must be positive; --steps, --eval-seqs, --ffn-hidden >= 0")
    if a.dim % a.n_heads or (a.dim // a.n_heads) % 2:
        p.error("--dim must be a multiple of --n-heads with an even head size")
    return a


def main(argv=None):
    a = parse_args(argv)
    launched = "RANK" in os.environ
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(a.threads)
    if launched:
        dist.init_process_group("gloo")
    dp, tp = parse_mesh(a.mesh, world)
    c = spec.LmConfig(dim=a.dim, n_layers=a.n_layers, n_heads=a.n_heads,
                      ffn_hidden=a.ffn_hidden, seq_len=a.seq_len, tied=a.tie_embeddings)
    if tp > 1 and (c.n_heads % tp or c.ffn() % tp or (not c.tied and c.vocab % tp)):
        sys.exit(f"tp={tp}: heads, ffn hidden size and vocabulary must split tp ways")
    train, val, files = spec.load_corpus(a.text, a.val_fraction, a.seq_len)

    model = Transformer(c)
    load_canonical_init(model, c, a.seed)
    group, info = parallelize(model, c, a, dp, tp)
    d = info.get("dp_rank", 0)
    opt = make_optimizer(model.parameters(), a)

    if launched:
        dist.barrier()
    t0 = time.perf_counter()
    t1 = t0
    losses = []
    for step in range(a.steps):
        x, y = (torch.from_numpy(v) for v in
                spec.batch(train, a.seed, step, d * a.batch_size, a.batch_size, a.seq_len))
        loss = F.cross_entropy(model(x).view(-1, c.vocab), y.view(-1))
        loss.backward()
        if group is not None:
            average_grads(model, group, dp)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if step == 0:
            t1 = time.perf_counter()
    t2 = time.perf_counter()

    mean = torch.stack(losses).double() if losses else torch.zeros(0, dtype=torch.float64)
    if launched and world > 1 and mean.numel() > 0:
        dist.all_reduce(mean)  # tp ranks hold equal losses: the world mean is the dp mean
        mean /= world
    val_loss = None
    vx, vy = spec.val_windows(val, a.seq_len, a.eval_seqs)
    if len(vx):
        total = 0.0
        with torch.no_grad():
            for i in range(0, len(vx), a.batch_size):
                logits = model(torch.from_numpy(vx[i:i + a.batch_size]))
                total += float(F.cross_entropy(logits.view(-1, c.vocab),
                                               torch.from_numpy(vy[i:i + a.batch_size]).view(-1),
                                               reduction="sum").double())
        val_loss = total / vx.size
    flat = canonical_flat(model, c)
    if rank == 0:
        tokens = (a.steps - 1) * dp * a.batch_size * a.seq_len
        m = {"reference": "llama_reference", "torch": torch.__version__, "world_size": world,
             "dim": c.dim, "n_layers": c.n_layers, "n_heads": c.n_heads, "ffn_hidden": c.ffn(),
             "seq_len": c.seq_len, "vocab": c.vocab, "tied": c.tied, "params": int(flat.size),
             "batch_size": a.batch_size, "global_batch": dp * a.batch_size, "steps": a.steps,
             "seed": a.seed, "optimizer": a.optimizer, "lr": a.lr,
             "weight_decay": a.weight_decay if a.optimizer == "adamw" else 0.0,
             "momentum": a.momentum, "threads": a.threads, "text": a.text,
             "text_files": len(files), "train_bytes": int(train.size), "val_bytes": int(val.size),
             "step_losses": [float(v) for v in mean],
             "final_loss": float(mean[-1]) if a.steps else None, "val_loss": val_loss,
             "eval_windows": int(len(vx)),
             "unigram_baseline": spec.unigram_baseline(train, val, a.seq_len, a.eval_seqs)
             if len(vx) else None,
             "elapsed_seconds": t2 - t0,
             "tokens_per_sec": tokens / (t2 - t1) if a.steps > 1 and t2 > t1 else None,
             "param_sum": float(flat.astype(np.float64).sum()),
             "param_sumsq": float(np.square(flat.astype(np.float64)).sum()),
             "param_absmax": float(np.abs(flat).max()), **info}
        m["fingerprint"] = [m["param_sum"], m["param_sumsq"]]  # ddp-train's key
        print(f"llama_reference: dp={dp} tp={tp}: {a.steps} steps in {t2 - t0:.2f} s, "
              f"final loss {m['final_loss']}, val loss {val_loss}", flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(m, f, indent=2)
                f.write("\n")
        if a.write_params:
            flat.astype("<f4").tofile(a.write_params)
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
