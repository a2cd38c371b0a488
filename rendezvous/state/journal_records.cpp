// Encoding and decoding of journal records (journal_records.hpp).
#include "ddp/rdzv/journal_records.hpp"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ddp::rdzv::journal {
namespace {

constexpr std::size_t kFrame = 8;                  // u32 length + u32 crc
constexpr std::size_t kFixed = 1 + 8 + 8 + 4 + 4;  // type, id, number, two lengths

std::array<std::uint32_t, 256> make_table() {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0x82F63B78u ^ (c >> 1) : c >> 1;  // Castagnoli
    t[i] = c;
  }
  return t;
}

template <typename T>
void put_le(std::string& out, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xFF));
  }
}

template <typename T>
T get_le(const char* p) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return static_cast<T>(v);
}

bool known(std::uint8_t t) { return t >= 1 && t <= static_cast<std::uint8_t>(Type::next_lease); }

}  // namespace

std::uint32_t crc32c_portable(std::span<const char> bytes) {
  static const auto table = make_table();
  std::uint32_t c = 0xFFFFFFFFu;
  for (char ch : bytes) c = table[(c ^ static_cast<unsigned char>(ch)) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

#if defined(__x86_64__)
// SSE 4.2's crc32 instruction computes CRC-32C (the Castagnoli polynomial), 8 bytes a step:
// the record's checksum then costs nothing beside the store's work (docs/perf.md).
namespace {
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(std::span<const char> bytes) {
  const char* p = bytes.data();
  std::size_t n = bytes.size();
  std::uint64_t c = 0xFFFFFFFFu;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  auto c32 = static_cast<std::uint32_t>(c);
  for (; n > 0; ++p, --n) c32 = _mm_crc32_u8(c32, static_cast<unsigned char>(*p));
  return c32 ^ 0xFFFFFFFFu;
}
const bool kHasSse42 = __builtin_cpu_supports("sse4.2");
}  // namespace
#endif

std::uint32_t crc32c(std::span<const char> bytes) {
#if defined(__x86_64__)
  if (kHasSse42) return crc32c_sse42(bytes);
#endif
  return crc32c_portable(bytes);
}

void encode_header(std::string& out, std::uint64_t generation) {
  out.append(kMagic);
  put_le(out, generation);
}

bool decode_header(std::span<const char> bytes, std::uint64_t& generation) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    return false;
  }
  generation = get_le<std::uint64_t>(bytes.data() + kMagic.size());
  return true;
}

void encode(std::string& out, const Record& r) {
  const std::size_t at = out.size();
  out.append(kFrame, '\0');
  out.push_back(static_cast<char>(r.type));
  put_le(out, r.id);
  put_le(out, static_cast<std::uint64_t>(r.number));
  put_le(out, static_cast<std::uint32_t>(r.key.size()));
  out.append(r.key);
  put_le(out, static_cast<std::uint32_t>(r.value.size()));
  out.append(r.value);
  const auto len = static_cast<std::uint32_t>(out.size() - at - kFrame);
  const std::uint32_t crc = crc32c({out.data() + at + kFrame, len});
  for (std::size_t i = 0; i < 4; ++i) {
    out[at + i] = static_cast<char>((len >> (8 * i)) & 0xFF);
    out[at + 4 + i] = static_cast<char>((crc >> (8 * i)) & 0xFF);
  }
}

Next decode(std::span<const char> bytes) {
  Next n;
  if (bytes.empty()) return n;
  n.status = Decoded::torn;
  if (bytes.size() < kFrame) {
    n.why = "a record cut short in its frame";
    return n;
  }
  const auto len = get_le<std::uint32_t>(bytes.data());
  const auto crc = get_le<std::uint32_t>(bytes.data() + 4);
  if (len < kFixed || len > kMaxPayload) {
    n.why = "a record announcing " + std::to_string(len) + " bytes";
    return n;
  }
  if (bytes.size() - kFrame < len) {
    n.why = "a record cut short (" + std::to_string(bytes.size() - kFrame) + " of " +
            std::to_string(len) + " bytes)";
    return n;
  }
  const char* p = bytes.data() + kFrame;
  if (crc32c({p, len}) != crc) {
    n.why = "a record failing its checksum";
    return n;
  }
  const auto type = static_cast<std::uint8_t>(p[0]);
  const auto klen = get_le<std::uint32_t>(p + 17);
  if (!known(type) || klen > len - kFixed) {
    n.why = "a record of unknown shape";
    return n;
  }
  const auto vlen = get_le<std::uint32_t>(p + 21 + klen);
  if (21 + std::size_t{klen} + 4 + vlen != len) {
    n.why = "a record of unknown shape";
    return n;
  }
  n.record.type = static_cast<Type>(type);
  n.record.id = get_le<std::uint64_t>(p + 1);
  n.record.number = static_cast<std::int64_t>(get_le<std::uint64_t>(p + 9));
  n.record.key = {p + 21, klen};
  n.record.value = {p + 25 + klen, vlen};
  n.consumed = kFrame + len;
  n.status = Decoded::record;
  return n;
}

}  // namespace ddp::rdzv::journal
