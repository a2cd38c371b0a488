// See slurm_worker_env.hpp.
#include "ddp/launch/slurm_worker_env.hpp"
