// Tests of oom.hpp.
#include <catch2/catch.hpp>

#include "ddp/launch/oom.hpp"
