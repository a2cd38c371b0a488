// Who may use a store (docs/security.md): peers whose address is in a trusted network are
// admitted as they are (unmodified torch clients included); with a secret, any other peer must
// authenticate before its first request; without one, a closed store refuses it at once and an
// open store (today's ddprund) admits it. On loopback, a store may also admit only the sockets
// of its own user, root and listed uids (the kernel names a local socket's owner: peer_uid.hpp).
// Also the rate limit of the refusals' log lines.
// Pure: addresses, CIDRs and uids parsed and matched without sockets.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

struct sockaddr;

namespace ddp::rdzv {

// An IPv4 address is kept as its IPv4-mapped IPv6 form (::ffff:a.b.c.d), so that a v4 peer of
// a dual-stack listener matches a v4 CIDR.
struct IpAddr {
  std::array<std::uint8_t, 16> b{};
  bool is_v4() const;
  bool is_loopback() const;  // 127.0.0.0/8 or ::1
  std::string str() const;
};

struct Cidr {
  IpAddr net;
  int bits = 128;  // prefix length in the 128-bit (mapped) space
  bool contains(const IpAddr& a) const;
  std::string str() const;
};

// "10.0.0.0/8", "192.168.1.7" (/32), "fd00::/8", "::1". Throws ddp::ConfigError naming `text`.
Cidr parse_cidr(std::string_view text);
// A comma-separated list (empty entries refused; at most 256 entries). `what` names the flag.
std::vector<Cidr> parse_cidrs(std::string_view text, std::string_view what);
// The numeric address `text` ("10.1.2.3", "::1"); false when it is not one.
bool parse_ip(std::string_view text, IpAddr& out);
IpAddr from_sockaddr(const sockaddr* sa);  // AF_INET or AF_INET6; others give ::

// The loopback networks: 127.0.0.0/8 and ::1.
std::vector<Cidr> loopback_networks();

struct AccessPolicy {
  bool has_secret = false;
  // Admitted without authenticating.
  std::vector<Cidr> trusted;
  // Without a secret: refuse peers outside `trusted` (the workers' store of a round). With a
  // secret they may still authenticate.
  bool closed = false;
  // A peer on loopback is admitted at all only when its socket's owner is own_uid, root (0) or
  // one of `uids` (by_user); otherwise any local user is (torch's TCPStore).
  bool by_user = false;
  std::uint32_t own_uid = 0;
  std::vector<std::uint32_t> uids;
};

// At most this many uids in an allowlist.
inline constexpr std::size_t kMaxAllowedUids = 256;

// "any": nullopt (every local user); else a comma-separated list of uids or user names, each
// named by `lookup` (a name to its uid, nullopt when there is no such user; numbers are taken
// as they are). "" is the empty list: the store's own user and root only. Throws
// ddp::ConfigError naming `what` and the bad entry.
std::optional<std::vector<std::uint32_t>> parse_uids(
    std::string_view text, std::string_view what,
    const std::function<std::optional<std::uint32_t>(const std::string&)>& lookup);

enum class Access : std::uint8_t {
  admit,         // trusted address, or an open store without a secret
  authenticate,  // may only VALIDATE, HELLO, PING and AUTH until it has authenticated
  refuse,        // closed at once
};
// peer_uid: the owner of a loopback peer's socket (nullopt: not known, or not asked for).
Access classify(const AccessPolicy& policy, const IpAddr& peer,
                std::optional<std::uint32_t> peer_uid = std::nullopt);
// Whether classify() needs the peer's uid: a loopback peer of a by_user policy.
bool needs_uid(const AccessPolicy& policy, const IpAddr& peer);

// At most `burst` lines per `period`; what is held back is counted and reported with the next
// line let through. Not thread-safe: the caller locks.
class LogRateLimit {
 public:
  LogRateLimit(std::size_t burst, std::chrono::milliseconds period)
      : burst_(burst), period_(period) {}
  // True when a line may be written at `now`; `suppressed` is then set to the lines held back
  // since the last one written.
  bool allow(std::chrono::steady_clock::time_point now, std::uint64_t& suppressed);

 private:
  std::size_t burst_;
  std::chrono::milliseconds period_;
  std::chrono::steady_clock::time_point window_{};
  std::size_t used_ = 0;
  std::uint64_t held_ = 0;
};

}  // namespace ddp::rdzv
