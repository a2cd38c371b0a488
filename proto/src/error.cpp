// The error vocabulary's names and exit codes, and the " [file:line]" suffix of DDP_THROW.
#include "ddp/proto/error.hpp"

#include <cstring>

namespace ddp {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::usage: return "usage";
    case Errc::config: return "config";
    case Errc::io: return "io";
    case Errc::protocol: return "protocol";
    case Errc::peer_gone: return "peer gone";
    case Errc::timeout: return "timeout";
    case Errc::cuda: return "cuda";
    case Errc::nccl: return "nccl";
  }
  return "?";
}

int exit_code(Errc code) { return code == Errc::usage || code == Errc::config ? 2 : 1; }

namespace detail {

std::string where(const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  return std::string(" [") + (base ? base + 1 : file) + ":" + std::to_string(line) + "]";
}

}  // namespace detail
}  // namespace ddp
