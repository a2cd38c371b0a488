// Tests of gpu_devices.hpp.
#include <catch2/catch.hpp>

#include "ddp/launch/gpu_devices.hpp"
