"""`python -m ddprun ARGS`: the same as `ddprun ARGS`."""
import sys

from ddprun import run

run("ddprun", sys.argv[1:])
