// See oom.hpp.
#include "ddp/launch/oom.hpp"
