// The project's version, one source of truth: project(VERSION) in the top CMakeLists.txt, which
// the wheel (pyproject.toml reads it) and the .deb (CPack) share. Every binary prints it with
// --version as "<name> <version>".
#pragma once

#include <string>

namespace ddp {

// "0.1.0"
const char* version();
// How this build is shipped: "source", "wheel" (pip) or "package" (the .deb).
const char* build_kind();
// "<program> <version>" plus the build's kind (wheel, package or source), for --version.
std::string version_line(const std::string& program);

}  // namespace ddp
