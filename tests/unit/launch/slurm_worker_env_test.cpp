// Tests of slurm_worker_env.hpp.
#include <catch2/catch.hpp>

#include "ddp/launch/slurm_worker_env.hpp"
