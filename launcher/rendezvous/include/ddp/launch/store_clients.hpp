// The agent's three connections to the rendezvous store and their timeouts, decided in one
// place from --rdzv-conf (all three go through the one dialer, rdzv::StoreClient):
//   rendezvous: each reply within read_timeout (60 s); connecting retries for the join
//               timeout (600 s), since the node that hosts the store may start later;
//   liveness:   the heartbeat's replies within the outage grace (or the lease's ttl, if
//               longer): the lease is bound to this connection, and a connection given up on
//               a store that is only slow (stopped, cut off) would fire the will when the
//               store sees it close; 10 s to connect (the store is up by then);
//   watcher:    holds one WAIT for a whole round (renewed each day): its replies are bounded
//               by that WAIT, not by read_timeout; connecting as the rendezvous client does.
//   status:     the live status's publisher (one SET per interval) and its HTTP views: 10 s
//               to connect and for each reply (a view is never worth waiting longer for).
#pragma once

#include <algorithm>
#include <chrono>
#include <string>

#include "ddp/rdzv/client.hpp"

namespace ddp::launch {

struct StoreClients {
  rdzv::ClientOptions rendezvous, liveness, watcher, status;
};

inline StoreClients store_clients(std::chrono::milliseconds read_timeout,
                                  std::chrono::milliseconds join_timeout,
                                  std::chrono::milliseconds lease_ttl,
                                  std::chrono::milliseconds outage_grace,
                                  const std::string& secret = {},
                                  std::shared_ptr<const rdzv::TlsContext> tls = nullptr) {
  StoreClients c;
  for (auto* o : {&c.rendezvous, &c.liveness, &c.watcher, &c.status}) {
    o->secret = secret;
    o->tls = tls;
  }
  c.rendezvous.timeout = read_timeout;
  c.rendezvous.connect_timeout = join_timeout;
  c.liveness.timeout = std::max({lease_ttl, outage_grace, std::chrono::milliseconds(1000)});
  c.liveness.connect_timeout = std::chrono::seconds(10);
  c.watcher.timeout = read_timeout;
  c.watcher.connect_timeout = join_timeout;
  c.status.timeout = std::chrono::seconds(10);
  c.status.connect_timeout = std::chrono::seconds(10);
  return c;
}

}  // namespace ddp::launch
