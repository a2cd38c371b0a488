// The byte format of ddprund's journal and snapshot (journal.hpp), pure: no files. A file is a
// header (magic + generation) and records; each record is u32 payload length, u32 CRC-32C of
// the payload, then the payload: u8 type, u64 id, i64 number, u32-length key, u32-length value
// (little-endian). A record cut short or failing its CRC ends what is read (a torn tail).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ddp::rdzv::journal {

inline constexpr std::string_view kMagic = "DDPRUNJ1";
inline constexpr std::size_t kHeaderBytes = 16;  // magic + u64 generation
// The largest record a reader accepts: one largest value and key with room to spare.
inline constexpr std::uint32_t kMaxPayload = 80u << 20;

enum class Type : std::uint8_t {
  put = 1,
  erase = 2,
  append = 3,
  queue_push = 4,
  queue_pop = 5,
  lease = 6,        // id, number = ttl ms, value "1" when bound to its connection
  lease_key = 7,    // id, key
  lease_will = 8,   // id, key, value
  lease_drop = 9,   // id
  next_lease = 10,  // id
};

struct Record {
  Type type = Type::put;
  std::uint64_t id = 0;
  std::int64_t number = 0;
  std::string_view key, value;  // into the buffer decoded (or the caller's strings)
};

std::uint32_t crc32c(std::span<const char> bytes);
// The same a byte at a time (what crc32c uses where the CPU has no crc32 instruction).
std::uint32_t crc32c_portable(std::span<const char> bytes);

void encode_header(std::string& out, std::uint64_t generation);
// The generation, or false when `bytes` does not start with a header.
bool decode_header(std::span<const char> bytes, std::uint64_t& generation);

void encode(std::string& out, const Record& r);

enum class Decoded { record, end, torn };
struct Next {
  Decoded status = Decoded::end;
  Record record;
  std::size_t consumed = 0;
  std::string why;  // torn: what was wrong
};
// The record at the start of `bytes`: end when empty, torn when cut short, over kMaxPayload,
// failing its CRC, or of an unknown type.
Next decode(std::span<const char> bytes);

}  // namespace ddp::rdzv::journal
