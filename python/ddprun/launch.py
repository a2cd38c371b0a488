"""`python -m ddprun.launch ARGS`: torch.distributed.launch's stand-in, `ddprun launch ARGS`
(each script gets --local-rank=N unless --use-env is given)."""
import sys

from ddprun import run

if __name__ == "__main__":
    run("ddprun", ["launch", *sys.argv[1:]])
