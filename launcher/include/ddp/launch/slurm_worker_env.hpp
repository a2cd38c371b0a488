// --per-worker-slurm-env: Slurm's task variables rewritten for each worker from its ranks.
#pragma once
