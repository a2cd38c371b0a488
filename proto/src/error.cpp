// Formats the " [file:line]" suffix that DDP_THROW appends to every error message.
#include "ddp/proto/error.hpp"

#include <cstring>

namespace ddp::detail {

std::string where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(" [") + (base ? base + 1 : file) + ":" + std::to_string(line) + "]";
}

}  // namespace ddp::detail
