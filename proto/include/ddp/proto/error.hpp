// The error vocabulary shared by every part of ddprun (gloo's error.h shape): one base, a few
// kinds, each with a code, caught by type. Synchronous APIs throw one of these; DDP_THROW adds
// [file:line]; the CUDA, cuBLAS and NCCL check macros (kernels/include/ddp/kernels/check.hpp)
// add the failed call. Only main() catches, and maps the kind to the exit code.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace ddp {

enum class Errc : unsigned char {
  usage,      // a bad command line: fix the flag it names (exit 2)
  config,     // a bad setting, file or environment variable (exit 2)
  io,         // the OS refused (socket, file, process): see the errno text
  protocol,   // a peer sent or answered something invalid
  peer_gone,  // a peer or connection went away (a worker, an agent, the store)
  timeout,    // something did not happen in time: the message names what and how long
  cuda,       // a CUDA runtime or cuBLAS call failed
  nccl,       // an NCCL call failed
};

std::string_view errc_name(Errc code);
// 2 for usage and configuration errors (as argparse and torchrun), 1 for the rest.
int exit_code(Errc code);

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
  virtual Errc code() const noexcept = 0;
};

#define DDP_ERROR_KIND(Name, Code)                             \
  struct Name : Error {                                        \
    using Error::Error;                                        \
    Errc code() const noexcept override { return Errc::Code; } \
  }
DDP_ERROR_KIND(UsageError, usage);
DDP_ERROR_KIND(ConfigError, config);
DDP_ERROR_KIND(IoError, io);
DDP_ERROR_KIND(ProtocolError, protocol);
DDP_ERROR_KIND(PeerGoneError, peer_gone);
DDP_ERROR_KIND(TimeoutError, timeout);
DDP_ERROR_KIND(CudaError, cuda);
DDP_ERROR_KIND(NcclError, nccl);
#undef DDP_ERROR_KIND

namespace detail {
std::string where(const char* file, int line);
}  // namespace detail

}  // namespace ddp

#define DDP_THROW(Type, msg) throw Type(std::string(msg) + ::ddp::detail::where(__FILE__, __LINE__))
