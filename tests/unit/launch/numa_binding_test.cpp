// Tests of numa_binding.hpp.
#include <catch2/catch.hpp>

#include "ddp/launch/numa_binding.hpp"
