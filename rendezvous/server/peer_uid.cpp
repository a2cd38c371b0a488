// The owner of a local TCP peer's socket through sock_diag (peer_uid.hpp).
#include "ddp/rdzv/peer_uid.hpp"

#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstring>

namespace ddp::rdzv {

namespace {

// The peer's socket seen from its side: its source is our peer address, its destination our
// local one. IPv4-mapped IPv6 addresses (a dual-stack listener's v4 peers) are asked as IPv4.
bool fill_id(const sockaddr_storage& peer, const sockaddr_storage& local, inet_diag_req_v2& r) {
  const auto v4_of = [](const sockaddr_storage& s, std::uint32_t& addr, std::uint16_t& port) {
    if (s.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&s);
      addr = in->sin_addr.s_addr;
      port = in->sin_port;
      return true;
    }
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&s);
    if (s.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
      std::memcpy(&addr, in6->sin6_addr.s6_addr + 12, 4);
      port = in6->sin6_port;
      return true;
    }
    return false;
  };
  std::uint32_t pa = 0, la = 0;
  std::uint16_t pp = 0, lp = 0;
  if (v4_of(peer, pa, pp) && v4_of(local, la, lp)) {
    r.sdiag_family = AF_INET;
    r.id.idiag_src[0] = pa;
    r.id.idiag_dst[0] = la;
    r.id.idiag_sport = pp;
    r.id.idiag_dport = lp;
    return true;
  }
  if (peer.ss_family != AF_INET6 || local.ss_family != AF_INET6) return false;
  const auto* p6 = reinterpret_cast<const sockaddr_in6*>(&peer);
  const auto* l6 = reinterpret_cast<const sockaddr_in6*>(&local);
  r.sdiag_family = AF_INET6;
  std::memcpy(r.id.idiag_src, &p6->sin6_addr, 16);
  std::memcpy(r.id.idiag_dst, &l6->sin6_addr, 16);
  r.id.idiag_sport = p6->sin6_port;
  r.id.idiag_dport = l6->sin6_port;
  return true;
}

}  // namespace

std::optional<std::uint32_t> local_peer_uid(int fd) {
  sockaddr_storage peer{}, local{};
  socklen_t pl = sizeof peer, ll = sizeof local;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) {
    return std::nullopt;
  }
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg{};
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;
  msg.req.sdiag_protocol = IPPROTO_TCP;
  msg.req.idiag_states = ~0u;
  msg.req.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  msg.req.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (!fill_id(peer, local, msg.req)) return std::nullopt;
  const int nl = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return std::nullopt;
  timeval tv{1, 0};  // the kernel answers at once; never hang the accept loop on it
  ::setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  std::optional<std::uint32_t> uid;
  if (::sendto(nl, &msg, sizeof msg, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) ==
      static_cast<ssize_t>(sizeof msg)) {
    alignas(nlmsghdr) char buf[8192];
    const ssize_t n = ::recv(nl, buf, sizeof buf, 0);
    const auto* h = reinterpret_cast<const nlmsghdr*>(buf);
    if (n > 0 && NLMSG_OK(h, static_cast<unsigned>(n)) && h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
        h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
      uid = static_cast<const inet_diag_msg*>(NLMSG_DATA(h))->idiag_uid;
    }
  }
  ::close(nl);
  return uid;
}

bool peer_uid_works() {
  const int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int a = -1;
  bool ok = false;
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof at;
  if (l >= 0 && c >= 0 && ::bind(l, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0 &&
      ::listen(l, 1) == 0 && ::getsockname(l, reinterpret_cast<sockaddr*>(&at), &len) == 0 &&
      ::connect(c, reinterpret_cast<sockaddr*>(&at), sizeof at) == 0) {
    a = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    ok = a >= 0 && local_peer_uid(a) == ::geteuid();
  }
  for (int fd : {a, c, l}) {
    if (fd >= 0) ::close(fd);
  }
  return ok;
}

}  // namespace ddp::rdzv
