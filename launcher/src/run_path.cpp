// See run_path.hpp.
#include "ddp/launch/run_path.hpp"
