// The networks an agent's stores admit without authenticating (store_access.hpp).
#include "store_access.hpp"

#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>

namespace ddp::launch {

namespace {
void add_unique(std::vector<rdzv::Cidr>& out, const rdzv::Cidr& c) {
  auto same = [&](const rdzv::Cidr& o) { return o.bits == c.bits && o.net.b == c.net.b; };
  if (std::none_of(out.begin(), out.end(), same)) out.push_back(c);
}

rdzv::Cidr host_cidr(const rdzv::IpAddr& a) { return rdzv::Cidr{a, 128}; }

// `name`'s addresses (a numeric one as it is); false when it resolves to none.
bool resolve(const std::string& name, std::vector<rdzv::Cidr>& out) {
  rdzv::IpAddr ip;
  if (rdzv::parse_ip(name, ip)) {
    add_unique(out, host_cidr(ip));
    return true;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (name.empty() || ::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0) return false;
  bool any = false;
  for (auto* a = res; a; a = a->ai_next) {
    add_unique(out, host_cidr(rdzv::from_sockaddr(a->ai_addr)));
    any = true;
  }
  ::freeaddrinfo(res);
  return any;
}
}  // namespace

std::vector<std::string> interface_addresses() {
  std::vector<std::string> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (auto* i = ifs; i && out.size() < kMaxNodeAddresses; i = i->ifa_next) {
    if (!i->ifa_addr || !(i->ifa_flags & IFF_UP)) continue;
    if (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6) continue;
    const rdzv::IpAddr a = rdzv::from_sockaddr(i->ifa_addr);
    const bool link_local = !a.is_v4() && a.b[0] == 0xfe && (a.b[1] & 0xc0) == 0x80;
    if (a.is_loopback() || link_local) continue;
    std::string s = a.str();
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(std::move(s));
  }
  ::freeifaddrs(ifs);
  return out;
}

std::vector<rdzv::Cidr> round_networks(const std::vector<NodeDesc>& members,
                                       const std::vector<rdzv::Cidr>& allow,
                                       std::vector<std::string>* unresolved) {
  std::vector<rdzv::Cidr> out = rdzv::loopback_networks();
  for (const auto& a : interface_addresses()) resolve(a, out);
  for (const auto& m : members) {
    bool any = false;
    for (const auto& ip : m.ips) {
      rdzv::IpAddr parsed;
      if (rdzv::parse_ip(ip, parsed)) {
        add_unique(out, host_cidr(parsed));
        any = true;
      }
    }
    any = resolve(m.addr, out) || any;
    if (!any && unresolved) unresolved->push_back(m.host + " (" + m.addr + ")");
  }
  for (const auto& c : allow) add_unique(out, c);
  return out;
}

}  // namespace ddp::launch
