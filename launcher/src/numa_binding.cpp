// See numa_binding.hpp.
#include "ddp/launch/numa_binding.hpp"
