// The error vocabulary shared by every part of ddprun (gloo's error.h shape).
// Synchronous APIs throw one of these; DDP_THROW adds [file:line]. Only main() catches.
#pragma once

#include <stdexcept>
#include <string>

namespace ddp {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ConfigError : Error {
  using Error::Error;
};
struct IoError : Error {
  using Error::Error;
};
struct TimeoutError : Error {
  using Error::Error;
};
struct ProtocolError : Error {
  using Error::Error;
};

namespace detail {
std::string where(const char* file, int line);
}  // namespace detail

}  // namespace ddp

#define DDP_THROW(Type, msg) throw Type(std::string(msg) + ::ddp::detail::where(__FILE__, __LINE__))
#define DDP_CHECK(cond, msg)                                                                      \
  do {                                                                                            \
    if (!(cond)) throw ::ddp::Error(std::string(msg) + ::ddp::detail::where(__FILE__, __LINE__)); \
  } while (0)
