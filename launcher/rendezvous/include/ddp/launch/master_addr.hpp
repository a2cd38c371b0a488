// The workers' MASTER_ADDR, torchrun 2.15's defaults first, and where their store listens;
// which keys of the agent's store are the workers'. Pure (no lookups): the resolving callers
// are in launcher/rendezvous/agent_store.cpp.
//
// torchrun's rules: static gives --master-addr (or the --rdzv-endpoint host) as written; c10d
// and --standalone give --local-addr, else Python's socket.getfqdn().
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddp::launch {

// Python's getfqdn() rule over gethostbyaddr()'s answer: the first of the name and its aliases
// that holds a dot, else the name.
std::string pick_fqdn(const std::string& name, const std::vector<std::string>& aliases);

// A numeric IPv4/IPv6 address in 127.0.0.0/8 or ::1.
bool is_loopback_address(const std::string& numeric);

struct WorkersAddr {
  std::string master_addr;  // MASTER_ADDR
  std::string bind;         // where the workers' store listens
};

// c10d and --standalone. --local-addr wins (listening on it if it is loopback, else on every
// interface). Otherwise the fqdn, as torchrun gives; a job `confined` to this machine
// (--standalone, or a loopback endpoint) keeps its store off the network: it listens on the
// loopback address the fqdn names (`resolved`: the fqdn's numeric addresses, in order), or,
// when the fqdn names no loopback address, MASTER_ADDR is 127.0.0.1. A job across machines
// listens on every interface, as torch's TCPStore does.
WorkersAddr choose_workers_addr(const std::string& local_addr, bool confined,
                                const std::string& fqdn, const std::vector<std::string>& resolved);

// The static backend's MASTER_ADDR: the endpoint's host as written, IPv6 brackets removed (as
// torch's parse_rendezvous_endpoint does).
std::string static_master_addr(const std::string& host);

// A key that the workers wrote in an agent's store (static, --standalone): anything outside the
// agents' own "/ddprun/" namespace.
bool is_worker_key(std::string_view key);

}  // namespace ddp::launch
