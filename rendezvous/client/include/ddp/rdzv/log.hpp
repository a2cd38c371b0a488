// Named spdlog loggers per subsystem ("rdzv", "launch", ...), created once, level from
// DDP_LOG_LEVEL (trace|debug|info|warn|error|off; default info). Lines go to stderr.
#pragma once

#include <spdlog/spdlog.h>

namespace ddp {

spdlog::logger& logger(const char* subsystem);

}  // namespace ddp
