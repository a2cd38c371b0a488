// loadgen_wire: what both store_loadgen modes share: the clock, a seedable PRNG, and the
// socket and torch 2.x wire helpers (connect, VALIDATE, non-blocking flush and drain).
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "ddp/proto/opcodes.hpp"

namespace loadgen {

namespace proto = ddp::proto;
using Clock = std::chrono::steady_clock;
constexpr proto::Dialect kV2 = proto::Dialect::v2;
constexpr std::uint64_t kMs = 1'000'000;
constexpr std::size_t kMaxReplyBytes = 64u << 20;  // a GET length beyond this is a desync

std::uint64_t now_ns();

// splitmix64: small, seedable, good enough to pick ops and keys.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  std::uint64_t below(std::uint64_t n) { return next() % n; }
};

struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
};

Endpoint resolve(const std::string& host, int port);
void set_nodelay(int fd);
void set_nonblocking(int fd);
// Blocking connect, retried for up to 10 s while the server's backlog refuses us.
int connect_blocking(const Endpoint& ep);
void send_all(int fd, std::string_view data);
void recv_exact(int fd, char* buf, std::size_t len);
void put_validate(std::string& out);

enum class Flush { done, blocked, error };

Flush flush(int fd, const std::string& out, std::size_t& off);
// Reads everything available into `in`; false on EOF or a hard error.
bool drain(int fd, std::string& in);

template <typename T>
T load_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace loadgen
