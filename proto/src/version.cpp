// The version (version.hpp), compiled with DDP_VERSION and DDP_BUILD_KIND from CMake.
#include "ddp/proto/version.hpp"

#ifndef DDP_VERSION
#error "DDP_VERSION comes from project(VERSION) in CMakeLists.txt"
#endif
#ifndef DDP_BUILD_KIND
#define DDP_BUILD_KIND "source"
#endif

namespace ddp {

const char* version() { return DDP_VERSION; }
const char* build_kind() { return DDP_BUILD_KIND; }

std::string version_line(const std::string& program) {
  return program + " " + DDP_VERSION + " (" + DDP_BUILD_KIND + " build)";
}

}  // namespace ddp
