// Tests of run_path.hpp.
#include <catch2/catch.hpp>

#include "ddp/launch/run_path.hpp"
