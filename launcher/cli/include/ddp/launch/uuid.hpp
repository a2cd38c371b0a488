// A random (version 4) UUID as Python's uuid.uuid4() writes it: torchrun's run ids for
// --standalone and its file timer's FIFO names.
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace ddp::launch {

inline std::string random_uuid4() {
  std::random_device rd;
  std::mt19937_64 rng((static_cast<std::uint64_t>(rd()) << 32) ^ rd());
  static const char* hex = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 32; ++i) {
    if (i == 8 || i == 12 || i == 16 || i == 20) id.push_back('-');
    auto nibble = rng() & 15;
    if (i == 12) nibble = 4;                 // version 4 (random)
    if (i == 16) nibble = 8 | (nibble & 3);  // the RFC 4122 variant
    id.push_back(hex[nibble]);
  }
  return id;
}

}  // namespace ddp::launch
