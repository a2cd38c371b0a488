// Subsystem loggers on stderr; DDP_LOG_LEVEL sets the level of all of them.
#include "ddp/rdzv/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

#include <cstdlib>
#include <mutex>

#include "ddp/proto/knobs.hpp"

namespace ddp {

spdlog::logger& logger(const char* subsystem) {
  static std::mutex mu;
  std::lock_guard<std::mutex> g(mu);
  if (auto existing = spdlog::get(subsystem)) return *existing;
  auto l = spdlog::stderr_logger_mt(subsystem);
  l->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
  const auto lvl = knobs::text("DDP_LOG_LEVEL");
  l->set_level(lvl ? spdlog::level::from_str(*lvl) : spdlog::level::info);
  return *l;
}

}  // namespace ddp
