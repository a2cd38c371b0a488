// The agent's rendezvous store: hosting it (--standalone, node rank 0 of a static job, or the
// endpoint's host for c10d, torch's is_host heuristic), connecting to it while a stop signal
// can still end the wait, and refusing another job's agent store. The workers' address
// (master_addr.hpp) with its lookups, and the clearing of the workers' keys from an agent's
// store that serves them (static, --standalone) between rounds. Private to the launcher.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ddp/launch/config.hpp"
#include "ddp/launch/master_addr.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/rdzv/server.hpp"
#include "store_access.hpp"

namespace ddp::launch {

std::string hostname();
bool is_loopback(const std::string& host);

// The address a server binds for `host`: loopback stays loopback; anything else listens on
// every interface, as torch's TCPStore does.
std::string bind_address(const std::string& host);

struct RendezvousStore {
  std::unique_ptr<rdzv::StoreServer> server;  // when this agent hosts it
  std::string host;                           // where to connect
  std::uint16_t port = 0;
  bool port_taken = false;  // we meant to host it, but something else holds the port
};

// Python's socket.getfqdn() for this host (hostname() when the lookups fail).
std::string fqdn();

// choose_workers_addr() for this host: the fqdn looked up only when --local-addr is not given.
WorkersAddr workers_addr(const std::string& local_addr, bool confined);

// A store this agent hosts (store_access.hpp): with the job's secret, peers outside `trusted`
// must authenticate; without one, `closed` refuses them.
std::unique_ptr<rdzv::StoreServer> start_server(const std::string& bind, std::uint16_t port,
                                                const StoreAccess& access,
                                                std::vector<rdzv::Cidr> trusted, bool closed);
// `private_bind`: where a private store (--standalone) listens; it serves the workers too.
// A store that serves torch workers (private, static) admits loopback without authenticating;
// the c10d rendezvous store only --store-allow (its clients are agents, which authenticate).
RendezvousStore open_rendezvous_store(const LaunchConfig& config, const std::string& private_bind,
                                      const StoreAccess& access);

// Deletes every key the workers wrote (is_worker_key) in an agent's store that serves them, so
// that a restarted round never reads an earlier round's addresses or counters. Returns how many.
std::size_t clear_worker_keys(rdzv::Store& store);

// Connects to the rendezvous store, which may not be up yet (another node hosts it), trying
// for up to co.connect_timeout in slices of a second so that a stop signal ends the wait.
// Returns null when a signal arrived on `sigfd` (left unread for the caller).
std::unique_ptr<rdzv::StoreClient> connect_store(const RendezvousStore& rs, rdzv::ClientOptions co,
                                                 int sigfd);

// open_rendezvous_store, then connect_store. When the port was taken as this agent meant to
// host (another agent of this job won it, a ddprund, or a passing connection holding that
// port a moment), nobody may be listening once it is free: then the agent tries to host again
// after each second nobody answered, within co.connect_timeout, so that two agents that both
// lost the port to a third process do not wait for each other until the join timeout.
std::unique_ptr<rdzv::StoreClient> host_or_join(RendezvousStore& rs, const LaunchConfig& config,
                                                const std::string& private_bind,
                                                const StoreAccess& access, rdzv::ClientOptions co,
                                                int sigfd);

// When this agent could not host the store because the port was taken: join only a store that
// an agent of this job hosts, or a plain one (a ddprund); refuse another job's agent store.
void check_shared_store(rdzv::StoreClient& store, const std::string& run_id,
                        const RendezvousStore& rs);

}  // namespace ddp::launch
