"""ddp-train --model llama (issue 20) end to end, under ddprun on one host:
- tp=2, dp=2 and dp=2,tp=2 (every --sharding level along dp) take the same steps as one rank
  on the same global batch: step losses within 1e-6 relative (measured ~6e-9: only the order
  of sums differs), the final weights' fingerprint (sum, sum of squares) within 1e-6;
- the tied output layer too;
- the communication each step hands the collectives equals the formula, per group;
- the model learns the fortune text: validation loss well below the unigram baseline;
- snapshots record the mesh and reshard: 2x2 (full sharding) -> 1x2 -> 4x1 (gradients), each
  resumed run following the uninterrupted one-rank run within 1e-5;
- the mesh line shows the tp groups on this host; bad sizes and meshes are refused by name;
- --denormals keep (IEEE subnormals) takes the same steps as the default flush, and does keep
  subnormals (a linear model's updates of ~1e-41 stay; flush makes them zero).
Bounded: tiny models, --epoch-steps/--max-steps, timeouts on every run."""
import json
import os
import sys

import numpy as np
import pytest

from ddp_train_helpers import ddprun, needs_ddp_train, output, read_snapshot, train

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import ddp_format as fmt  # noqa: E402

pytestmark = [needs_ddp_train]

SMALL = ("--model", "llama", "--dim", "32", "--n-layers", "2", "--n-heads", "4", "--seq-len",
         "32", "--eval-seqs", "8", "--optimizer", "adamw", "--lr", "3e-3")


def with_opts(opts):
    """SMALL with the flags in opts replacing theirs (a flag may be given once)."""
    given = {o for o in opts if o.startswith("--")}
    out, skip = [], False
    for i, a in enumerate(SMALL):
        if skip:
            skip = False
            continue
        if a in given and a != "--model":
            skip = i + 1 < len(SMALL) and not SMALL[i + 1].startswith("--")
            continue
        out.append(a)
    return out + list(opts)


def run(tmp_path, world, tag, *opts, epochs=1, epoch_steps=6, batch=8, snapshot="",
        save_every=0):
    m = tmp_path / f"m-{tag}.json"
    args = [str(epochs), str(save_every), "--epoch-steps", str(epoch_steps), "--batch-size",
            str(batch), "--snapshot", snapshot, "--metrics-json", str(m), *with_opts(opts)]
    p = ddprun(world, args, tmp_path, timeout=240) if world > 1 else \
        train(args, tmp_path, timeout=240)
    assert p.returncode == 0, output(p)
    with open(m) as f:
        return json.load(f), p


def close(a, b, rel):
    assert len(a) == len(b), (a, b)
    for x, y in zip(a, b):
        assert abs(x - y) <= rel * abs(x), (x, y)


MESHES = [("tp=2", 2, 8, "none"), ("dp=2", 2, 4, "full"), ("dp=2,tp=2", 4, 4, "none"),
          ("dp=2,tp=2", 4, 4, "optimizer"), ("dp=2,tp=2", 4, 4, "gradients"),
          ("dp=2,tp=2", 4, 4, "full")]


def test_every_mesh_takes_the_steps_of_one_rank(tmp_path):
    base, _ = run(tmp_path, 1, "one")
    assert len(base["step_losses"]) == 6
    for mesh, world, batch, level in MESHES:
        got, p = run(tmp_path, world, f"{mesh}-{level}", "--mesh", mesh, "--sharding", level,
                     batch=batch)
        assert got["mesh"] == {"dp": world // (2 if "tp" in mesh else 1),
                               "tp": 2 if "tp" in mesh else 1}
        close(base["step_losses"], got["step_losses"], 1e-6)
        close(base["fingerprint"], got["fingerprint"], 1e-6)
        comm = got["comm"]
        for group in ("tp", "dp"):
            assert comm[group]["measured_bytes_per_step"] == \
                comm[group]["formula_bytes_per_step"], (mesh, level, comm)
        if "tp" in mesh:
            assert comm["tp"]["measured_bytes_per_step"] > 0
            assert "tp groups [0 1] on" in p.stdout, p.stdout


def test_tied_output_layer_under_tensor_parallelism(tmp_path):
    base, _ = run(tmp_path, 1, "tied-one", "--tie-embeddings")
    got, _ = run(tmp_path, 4, "tied-2x2", "--tie-embeddings", "--mesh", "dp=2,tp=2",
                 "--sharding", "full", batch=4)
    untied, _ = run(tmp_path, 1, "untied-one")
    assert got["params"] < untied["params"]  # no output matrix
    close(base["step_losses"], got["step_losses"], 1e-6)
    close(base["fingerprint"], got["fingerprint"], 1e-6)


def test_flushing_denormals_keeps_the_steps(tmp_path):
    flush, _ = run(tmp_path, 1, "flush")  # the default
    keep, _ = run(tmp_path, 1, "keep", "--denormals", "keep")
    close(keep["step_losses"], flush["step_losses"], 1e-6)
    close(keep["fingerprint"], flush["fingerprint"], 1e-6)
    # The steps agree, so they cannot tell whether keep took effect: a subnormal lr (1e-41) on
    # zero weights moves them by lr x gradient, itself subnormal. Kept, the weights end
    # subnormal and non-zero; flushed (DAZ reads lr as 0), they stay exactly zero.
    tiny = np.finfo(np.float32).tiny  # the smallest normal float
    for mode in ("flush", "keep"):
        snap = tmp_path / f"linear-{mode}.ddp"
        fmt.fresh_snapshot(snap, np.zeros(21, np.float32), optimizer="sgd", momentum=0.0,
                           seed=0, lr=1e-41, world_size=1, batch_size=32, model="linear")
        p = train(["1", "0", "--model", "linear", "--dataset", "synthetic", "--synthetic-size",
                   "64", "--batch-size", "32", "--lr", "1e-41", "--device", "cpu",
                   "--snapshot", str(snap), "--denormals", mode], tmp_path)
        assert p.returncode == 0, output(p)
        h, params, _, _ = read_snapshot(snap)
        assert h["global_step"] == 2, h
        if mode == "flush":
            assert not np.any(params), (mode, params)
        else:
            assert np.all((params != 0) & (np.abs(params) < tiny)), (mode, params)


def test_learns_the_text_below_the_unigram_baseline(tmp_path):
    got, p = run(tmp_path, 2, "learn", "--mesh", "tp=2", "--dim", "64", "--lr", "5e-3",
                 epochs=2, epoch_steps=60, batch=16)
    base = got["unigram_val_loss"]
    assert 3.0 < base < 5.0, base  # bytes of English text
    assert len(got["val_losses"]) == 2
    assert got["val_losses"][1] < got["val_losses"][0]
    assert got["val_loss"] < base - 0.5, (got["val_loss"], base)
    assert "val ppl" in p.stdout


def test_snapshots_reshard_across_meshes(tmp_path):
    snap = str(tmp_path / "lm.ddp")
    ref, _ = run(tmp_path, 1, "ref", epochs=3, epoch_steps=4)
    run(tmp_path, 4, "a", "--mesh", "dp=2,tp=2", "--sharding", "full", epochs=1,
        epoch_steps=4, batch=4, snapshot=snap, save_every=1)
    index = (tmp_path / "lm.ddp").read_bytes()
    assert b'"mesh":"dp=2,tp=2"' in index
    b, pb = run(tmp_path, 2, "b", "--mesh", "tp=2", epochs=2, epoch_steps=4, snapshot=snap,
                save_every=1)
    assert "resumed from" in pb.stdout and b["resumed_from"] == [1, 0, 4]
    close(ref["step_losses"][4:8], b["step_losses"], 1e-5)
    c, _ = run(tmp_path, 4, "c", "--mesh", "dp=4", "--sharding", "gradients", epochs=3,
               epoch_steps=4, batch=2, snapshot=snap, save_every=1)
    assert c["resumed_from"] == [2, 0, 8]
    close(ref["step_losses"][8:12], c["step_losses"], 1e-5)
    close(ref["fingerprint"], c["fingerprint"], 1e-5)


@pytest.mark.parametrize("bad,says", [
    (("--n-heads", "5"), "--dim 32 is not a multiple of --n-heads 5"),
    (("--n-heads", "32", "--dim", "32"), "rotary"),
    (("--dim", "0"), "--dim 0"),
    (("--seq-len", "100000"), "--seq-len 100000"),
    (("--batch-size", "100000"), "tokens per rank and step"),
    (("--mesh", "dp=2"), "--mesh"),
    (("--text", "/nonexistent/text"), "/nonexistent/text"),
    (("--denormals", "sometimes"), "--denormals must be flush or keep"),
])
def test_bad_sizes_and_meshes_are_refused_by_name(tmp_path, bad, says):
    args = ["1", "0", "--max-steps", "1", "--snapshot", "", *with_opts(bad)]
    p = train(args, tmp_path, timeout=60)
    assert p.returncode != 0
    assert says in p.stderr, p.stderr


def test_mesh_not_dividing_the_world_is_refused(tmp_path):
    args = ["1", "0", *SMALL, "--max-steps", "1", "--snapshot", "", "--mesh", "tp=3"]
    p = ddprun(2, args, tmp_path, timeout=120)
    assert p.returncode != 0
    assert "tp=3" in p.stderr + p.stdout
