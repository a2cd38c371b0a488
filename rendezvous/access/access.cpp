// Addresses, CIDRs, the admission decision and the refusals' log rate limit (access.hpp).
#include "ddp/rdzv/access.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "ddp/proto/error.hpp"
#include "ddp/proto/number.hpp"

namespace ddp::rdzv {

namespace {
constexpr std::size_t kMaxCidrs = 256;
constexpr std::array<std::uint8_t, 12> kMappedPrefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

IpAddr mapped(const in_addr& a) {
  IpAddr out;
  std::memcpy(out.b.data(), kMappedPrefix.data(), kMappedPrefix.size());
  std::memcpy(out.b.data() + 12, &a, 4);
  return out;
}
}  // namespace

bool IpAddr::is_v4() const { return std::memcmp(b.data(), kMappedPrefix.data(), 12) == 0; }

bool IpAddr::is_loopback() const {
  if (is_v4()) return b[12] == 127;
  IpAddr one;
  one.b[15] = 1;
  return b == one.b;
}

std::string IpAddr::str() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (is_v4()) {
    ::inet_ntop(AF_INET, b.data() + 12, buf, sizeof(buf));
  } else {
    ::inet_ntop(AF_INET6, b.data(), buf, sizeof(buf));
  }
  return buf;
}

bool parse_ip(std::string_view text, IpAddr& out) {
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  if (text.empty() || text.size() >= INET6_ADDRSTRLEN) return false;
  const std::string s(text);
  in_addr v4{};
  if (::inet_pton(AF_INET, s.c_str(), &v4) == 1) {
    out = mapped(v4);
    return true;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, s.c_str(), &v6) == 1) {
    std::memcpy(out.b.data(), &v6, 16);
    return true;
  }
  return false;
}

bool Cidr::contains(const IpAddr& a) const {
  int full = bits / 8, rest = bits % 8;
  if (std::memcmp(a.b.data(), net.b.data(), static_cast<std::size_t>(full)) != 0) return false;
  if (rest == 0) return true;
  const auto mask = static_cast<std::uint8_t>(0xff << (8 - rest));
  return (a.b[static_cast<std::size_t>(full)] & mask) ==
         (net.b[static_cast<std::size_t>(full)] & mask);
}

std::string Cidr::str() const {
  return net.str() + "/" + std::to_string(net.is_v4() ? bits - 96 : bits);
}

Cidr parse_cidr(std::string_view text) {
  const std::string shown(text.substr(0, 80));
  auto slash = text.find('/');
  Cidr c;
  if (!parse_ip(text.substr(0, slash), c.net)) {
    DDP_THROW(ConfigError, "'" + shown + "' is not an IP address or a CIDR (10.0.0.0/8, fd00::/8)");
  }
  const int max = c.net.is_v4() ? 32 : 128;
  int bits = max;
  if (slash != std::string_view::npos) {
    bits = static_cast<int>(
        parse_int(text.substr(slash + 1), "the prefix length of '" + shown + "'", 0, max));
  }
  c.bits = c.net.is_v4() ? bits + 96 : bits;
  // Host bits cleared, so that str() shows the network.
  for (int i = c.bits; i < 128; ++i) {
    c.net.b[static_cast<std::size_t>(i / 8)] &= static_cast<std::uint8_t>(~(0x80 >> (i % 8)));
  }
  return c;
}

std::vector<Cidr> parse_cidrs(std::string_view text, std::string_view what) {
  std::vector<Cidr> out;
  while (true) {
    auto comma = text.find(',');
    auto item = text.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.empty()) DDP_THROW(ConfigError, std::string(what) + ": an empty entry in the list");
    if (out.size() == kMaxCidrs) {
      DDP_THROW(ConfigError,
                std::string(what) + ": more than " + std::to_string(kMaxCidrs) + " networks");
    }
    try {
      out.push_back(parse_cidr(item));
    } catch (const ConfigError& e) {
      throw ConfigError(std::string(what) + ": " + e.what());
    }
    if (comma == std::string_view::npos) break;
    text = text.substr(comma + 1);
  }
  return out;
}

IpAddr from_sockaddr(const sockaddr* sa) {
  IpAddr out;
  if (sa == nullptr) return out;
  if (sa->sa_family == AF_INET) {
    sockaddr_in in{};
    std::memcpy(&in, sa, sizeof(in));
    return mapped(in.sin_addr);
  }
  if (sa->sa_family == AF_INET6) {
    sockaddr_in6 in6{};
    std::memcpy(&in6, sa, sizeof(in6));
    std::memcpy(out.b.data(), &in6.sin6_addr, 16);
  }
  return out;
}

std::vector<Cidr> loopback_networks() { return {parse_cidr("127.0.0.0/8"), parse_cidr("::1")}; }

std::optional<std::vector<std::uint32_t>> parse_uids(
    std::string_view text, std::string_view what,
    const std::function<std::optional<std::uint32_t>(const std::string&)>& lookup) {
  if (text == "any") return std::nullopt;
  std::vector<std::uint32_t> out;
  std::size_t at = 0;
  while (!text.empty() && at <= text.size()) {
    auto comma = text.find(',', at);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string one(text.substr(at, comma - at));
    if (one.empty())
      throw ConfigError(std::string(what) + ": an empty entry in '" + std::string(text) + "'");
    if (one.find_first_not_of("0123456789") == std::string::npos) {
      out.push_back(static_cast<std::uint32_t>(parse_int(one, what, 0, 0xFFFFFFFEll)));
    } else if (auto uid = lookup(one)) {
      out.push_back(*uid);
    } else {
      throw ConfigError(std::string(what) + ": no user named '" + one + "'");
    }
    if (out.size() > kMaxAllowedUids) {
      throw ConfigError(std::string(what) + ": more than " + std::to_string(kMaxAllowedUids) +
                        " users");
    }
    at = comma + 1;
  }
  return out;
}

bool needs_uid(const AccessPolicy& policy, const IpAddr& peer) {
  return policy.by_user && peer.is_loopback();
}

Access classify(const AccessPolicy& policy, const IpAddr& peer,
                std::optional<std::uint32_t> peer_uid) {
  if (needs_uid(policy, peer)) {
    const bool mine = peer_uid && (*peer_uid == policy.own_uid || *peer_uid == 0 ||
                                   std::find(policy.uids.begin(), policy.uids.end(), *peer_uid) !=
                                       policy.uids.end());
    if (!mine) return Access::refuse;
  }
  for (const auto& c : policy.trusted) {
    if (c.contains(peer)) return Access::admit;
  }
  if (policy.has_secret) return Access::authenticate;
  return policy.closed ? Access::refuse : Access::admit;
}

bool LogRateLimit::allow(std::chrono::steady_clock::time_point now, std::uint64_t& suppressed) {
  if (used_ == 0 || now - window_ >= period_) {
    window_ = now;
    used_ = 0;
  }
  if (used_ >= burst_) {
    ++held_;
    return false;
  }
  ++used_;
  suppressed = held_;
  held_ = 0;
  return true;
}

}  // namespace ddp::rdzv
