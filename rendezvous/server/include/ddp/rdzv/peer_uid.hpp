// Who owns the other end of a local TCP connection: the kernel's sock_diag netlink interface
// (inet_diag, the socket looked up by its exact four-tuple, as `ss -tep` does) gives the uid of
// the peer's socket, without parsing /proc/net/tcp. For loopback connections only: the peer's
// socket must be in this network namespace.
#pragma once

#include <cstdint>
#include <optional>

namespace ddp::rdzv {

// The uid owning the peer's socket of the connected TCP socket `fd` (a loopback connection
// accepted by this process, or one it made); nullopt when the kernel does not find it (the peer
// closed already, another namespace, no sock_diag).
std::optional<std::uint32_t> local_peer_uid(int fd);

// Whether local_peer_uid works here: a loopback connection of this process to itself is looked
// up and must come back as this process's user (a container without sock_diag says no).
bool peer_uid_works();

}  // namespace ddp::rdzv
