// Who may use the stores an agent hosts (docs/security.md): the job's secret and --store-allow,
// this host's own addresses (published in its node description), and the networks of a round's
// members, which the workers' store admits without authenticating. Private to the launcher.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ddp/launch/round.hpp"
#include "ddp/rdzv/access.hpp"
#include "ddp/rdzv/tls.hpp"

namespace ddp::launch {

struct StoreAccess {
  std::string secret;             // the job's (empty: none)
  std::vector<rdzv::Cidr> allow;  // --store-allow
  // --store-allow-uids: on loopback, this user, root and these (nullopt: any local user).
  std::optional<std::vector<std::uint32_t>> uids = std::vector<std::uint32_t>{};
  // DDPRUN_STORE_TLS_* (store_tls.hpp; null: plain): the hosted stores' server context.
  std::shared_ptr<const rdzv::TlsContext> tls;
  bool tls_only = false;
};

// This host's interface addresses (up, IPv4 and IPv6, loopback and link-local excluded), at
// most kMaxNodeAddresses, as text.
std::vector<std::string> interface_addresses();
inline constexpr std::size_t kMaxNodeAddresses = 64;

// The networks a round's workers' store admits: loopback, this host's addresses, each member's
// published addresses and its `addr` (resolved when a name), and --store-allow. A member whose
// addresses do not parse or resolve is named in `unresolved`.
std::vector<rdzv::Cidr> round_networks(const std::vector<NodeDesc>& members,
                                       const std::vector<rdzv::Cidr>& allow,
                                       std::vector<std::string>* unresolved = nullptr);

}  // namespace ddp::launch
