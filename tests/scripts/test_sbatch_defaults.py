"""The sbatch recipes in slurm/ (read as text; tests/slurm runs them on a real cluster): the ones
that run an unmodified PyTorch script keep torchrun's --max-restarts default, 0, since such a
script may save no checkpoint and would rerun from the start; their header says how to raise it.
The ddp-train recipes may restart (ddp-train resumes from its snapshot)."""
import pathlib
import re

SLURM = pathlib.Path(__file__).resolve().parents[2] / "slurm"


def test_pytorch_script_recipes_keep_torchruns_restart_default():
    scripts = sorted(SLURM.glob("torch-script-*.sbatch"))
    assert len(scripts) >= 2, scripts
    for s in scripts:
        text = s.read_text()
        given = re.findall(r"--max-restarts[= ](\S+)", text)
        assert given == ['"${MAX_RESTARTS:-0}"'], (s.name, given)
        assert "MAX_RESTARTS (default 0, torchrun's)" in text, s.name


def test_ddp_train_recipes_restart_from_their_snapshot():
    for s in sorted(SLURM.glob("ddp-train-*.sbatch")):
        text = s.read_text()
        assert "--max-restarts=3" in text and ("--snapshot" in text or "SNAPSHOT" in text), s.name
