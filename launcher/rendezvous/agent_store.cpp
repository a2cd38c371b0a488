// The agent's rendezvous store (see agent_store.hpp): host it, connect to it, check it; the
// workers' address (master_addr.hpp) and the clearing of their keys between rounds.
#include "agent_store.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "ddp/proto/error.hpp"

namespace ddp::launch {
namespace {

using std::chrono::milliseconds;

// torch's is_host heuristic: the endpoint names this machine (a loopback name, the hostname,
// or an address of one of its interfaces).
bool names_this_machine(const std::string& host) {
  if (is_loopback(host) || host == hostname()) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  ifaddrs* ifs = nullptr;
  bool match = false;
  if (::getifaddrs(&ifs) == 0) {
    for (auto* a = res; a && !match; a = a->ai_next) {
      for (auto* i = ifs; i && !match; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != a->ai_family) continue;
        if (a->ai_family == AF_INET) {
          match = reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr.s_addr ==
                  reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
        } else if (a->ai_family == AF_INET6) {
          match = std::memcmp(&reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr,
                              &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                              sizeof(in6_addr)) == 0;
        }
      }
    }
    ::freeifaddrs(ifs);
  }
  ::freeaddrinfo(res);
  return match;
}

// `name`'s numeric addresses, in getaddrinfo's order, without repeats; empty when it does not
// resolve.
std::vector<std::string> numeric_addresses(const std::string& name) {
  std::vector<std::string> out;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0) return out;
  for (auto* a = res; a; a = a->ai_next) {
    char buf[NI_MAXHOST] = {0};
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, buf, sizeof(buf), nullptr, 0, NI_NUMERICHOST) !=
        0) {
      continue;
    }
    if (std::find(out.begin(), out.end(), buf) == out.end()) out.emplace_back(buf);
  }
  ::freeaddrinfo(res);
  return out;
}

}  // namespace

std::string pick_fqdn(const std::string& name, const std::vector<std::string>& aliases) {
  if (name.find('.') != std::string::npos) return name;
  for (const auto& a : aliases) {
    if (a.find('.') != std::string::npos) return a;
  }
  return name;
}

bool is_loopback_address(const std::string& numeric) {
  in_addr v4{};
  if (::inet_pton(AF_INET, numeric.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return ::inet_pton(AF_INET6, numeric.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

WorkersAddr choose_workers_addr(const std::string& local_addr, bool confined,
                                const std::string& fqdn, const std::vector<std::string>& resolved) {
  if (!local_addr.empty()) return {local_addr, bind_address(local_addr)};
  if (!confined) return {fqdn, "0.0.0.0"};
  const bool all_loopback =
      !resolved.empty() && std::all_of(resolved.begin(), resolved.end(), is_loopback_address);
  if (!all_loopback) return {"127.0.0.1", "127.0.0.1"};
  auto v4 = std::find_if(resolved.begin(), resolved.end(),
                         [](const std::string& a) { return a.find(':') == std::string::npos; });
  return {fqdn, v4 != resolved.end() ? *v4 : resolved.front()};
}

std::string static_master_addr(const std::string& host) {
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

// The agents' own keys: the rendezvous's and the live status's (/ddprun/status/, job_view.hpp).
bool is_worker_key(std::string_view key) { return key.rfind("/ddprun/", 0) != 0; }

// Python's socket.getfqdn(): gethostbyaddr() of the hostname's first address, then the first
// of its name and aliases with a dot.
std::string fqdn() {
  const std::string host = hostname();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return host;
  hostent he{};
  hostent* found = nullptr;
  std::array<char, 8192> buf{};
  int herr = 0;
  if (res->ai_family == AF_INET) {
    const auto* sa = reinterpret_cast<const sockaddr_in*>(res->ai_addr);
    ::gethostbyaddr_r(&sa->sin_addr, sizeof(sa->sin_addr), AF_INET, &he, buf.data(), buf.size(),
                      &found, &herr);
  } else if (res->ai_family == AF_INET6) {
    const auto* sa = reinterpret_cast<const sockaddr_in6*>(res->ai_addr);
    ::gethostbyaddr_r(&sa->sin6_addr, sizeof(sa->sin6_addr), AF_INET6, &he, buf.data(), buf.size(),
                      &found, &herr);
  }
  ::freeaddrinfo(res);
  if (!found || !found->h_name) return host;
  std::vector<std::string> aliases;
  for (char** a = found->h_aliases; a && *a; ++a) aliases.emplace_back(*a);
  return pick_fqdn(found->h_name, aliases);
}

WorkersAddr workers_addr(const std::string& local_addr, bool confined) {
  if (!local_addr.empty()) return choose_workers_addr(local_addr, confined, "", {});
  const std::string name = fqdn();
  return choose_workers_addr("", confined, name,
                             confined ? numeric_addresses(name) : std::vector<std::string>{});
}

std::string hostname() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// The address a server binds for `host`: loopback stays loopback; anything else listens on
// every interface, as torch's TCPStore does.
std::string bind_address(const std::string& host) {
  if (host == "localhost") return "127.0.0.1";
  if (is_loopback(host)) return host;
  return "0.0.0.0";
}

std::unique_ptr<rdzv::StoreServer> start_server(const std::string& bind, std::uint16_t port,
                                                const StoreAccess& access,
                                                std::vector<rdzv::Cidr> trusted, bool closed) {
  rdzv::ServerOptions so;
  so.host = bind;
  so.port = port;
  so.threads = 1;
  so.secret = access.secret;
  so.trusted = std::move(trusted);
  so.closed = closed;
  so.loopback_uids = access.uids;
  so.tls = access.tls;
  so.tls_only = access.tls_only;
  auto s = std::make_unique<rdzv::StoreServer>(so);
  s->start();
  return s;
}

RendezvousStore open_rendezvous_store(const LaunchConfig& config, const std::string& private_bind,
                                      const StoreAccess& access) {
  RendezvousStore rs;
  // Agents authenticate (with a secret); torch workers come from this host until a round names
  // the other nodes (static: StoreRendezvous::form widens it).
  const std::vector<rdzv::Cidr> agents = access.allow;
  const std::vector<rdzv::Cidr> workers = round_networks({}, access.allow);
  auto start = [&](const std::string& bind, std::uint16_t port, bool serves_workers) {
    return start_server(bind, port, access, serves_workers ? workers : agents, false);
  };
  if (config.private_store) {  // a private store on a free port: two jobs never collide
    // Only this host's processes use it: closed to every other address, secret or not.
    rs.server = start_server(private_bind, 0, access, workers, true);
    rs.host = private_bind == "0.0.0.0" ? "127.0.0.1" : private_bind;
    rs.port = rs.server->port();
    return rs;
  }
  Endpoint ep = config.endpoint();
  rs.host = ep.host;
  rs.port = ep.port;
  if (config.rdzv_backend == "static") {
    if (config.node_rank != 0) return rs;
    try {
      rs.server = start(bind_address(ep.host), ep.port, true);
    } catch (const Error& e) {
      throw ConfigError("--node-rank=0 hosts the rendezvous store on " + ep.host + ":" +
                        std::to_string(ep.port) + ", but " + e.what() +
                        "; is another agent running with --node-rank=0, or another job on "
                        "this --master-port?");
    }
    return rs;
  }
  auto it = config.rdzv_conf.find("is_host");
  bool told = it != config.rdzv_conf.end();
  bool is_host = told ? (it->second == "1" || it->second == "true" || it->second == "True")
                      : names_this_machine(ep.host);
  if (!is_host) return rs;
  try {
    rs.server = start(bind_address(ep.host), ep.port, false);
  } catch (const Error&) {
    if (told) throw;  // is_host=true: hosting is required
    // Another agent of this job on this machine, a ddprund, or something else: told apart
    // once connected (check_shared_store).
    rs.port_taken = true;
  }
  return rs;
}

// Connects to the rendezvous store, which may not be up yet (another node hosts it): the one
// dialer retries for up to co.connect_timeout and gives up at once when a stop signal makes
// sigfd readable. Returns null then (the signal is left unread for the caller).
std::unique_ptr<rdzv::StoreClient> connect_store(const RendezvousStore& rs, rdzv::ClientOptions co,
                                                 int sigfd) {
  co.cancel_fd = sigfd;
  const rdzv::Endpoint ep{rs.host, rs.port};
  try {
    return std::make_unique<rdzv::StoreClient>(ep, co);
  } catch (const ProtocolError&) {
    throw ConfigError("the rendezvous endpoint " + ep.str() +
                      " answers, but it is not a ddprun store (a torchrun job's TCPStore on that "
                      "port?); choose another --rdzv-endpoint port");
  } catch (const IoError& e) {
    pollfd p{sigfd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1) return nullptr;
    throw IoError(
        "cannot reach the rendezvous store at " + ep.str() + " within the join timeout (" +
        std::to_string(co.connect_timeout.count() / 1000) + " s); is the node that " +
        "hosts it (node rank 0, or the endpoint's host) running? Last error: " + e.what());
  }
}

std::unique_ptr<rdzv::StoreClient> host_or_join(RendezvousStore& rs, const LaunchConfig& config,
                                                const std::string& private_bind,
                                                const StoreAccess& access, rdzv::ClientOptions co,
                                                int sigfd) {
  using std::chrono::milliseconds;
  rs = open_rendezvous_store(config, private_bind, access);
  const auto deadline = std::chrono::steady_clock::now() + co.connect_timeout;
  while (rs.port_taken) {
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= milliseconds(1000)) break;  // the last try, with the full timeout's message
    rdzv::ClientOptions quick = co;
    quick.connect_timeout = milliseconds(1000);
    try {
      return connect_store(rs, quick, sigfd);
    } catch (const IoError&) {
      // nobody answered a second: the port may be free now
    }
    rs = open_rendezvous_store(config, private_bind, access);
  }
  return connect_store(rs, co, sigfd);
}

// When this agent could not host the store because the port was taken: join only a store that
// an agent of this job hosts, or a plain one (a ddprund); refuse another job's agent store
// instead of silently joining that job (torch's fallback).
void check_shared_store(rdzv::StoreClient& store, const std::string& run_id,
                        const RendezvousStore& rs) {
  const std::string mine = "/ddprun/" + run_id + "/host";
  // The agent that won the port writes its key right after binding; give it a moment.
  for (int attempt = 0; attempt < 20; ++attempt) {
    if (store.check({mine})) return;  // an agent of this job hosts it
    for (const auto& k : store.list_keys()) {
      if (k.rfind("/ddprun/", 0) == 0 && k.size() > 13 &&
          k.compare(k.size() - 5, 5, "/host") == 0) {
        std::string other = k.substr(8, k.size() - 13);
        if (other == run_id) return;  // written between the check and the listing
        throw ConfigError("the rendezvous endpoint " + rs.host + ":" + std::to_string(rs.port) +
                          " is the store of another job (run id '" + other + "', hosted by " +
                          store.get(k) + "), not of run id '" + run_id +
                          "'; choose a free --rdzv-endpoint port, or the same --rdzv-id if "
                          "the two are one job");
      }
    }
    std::this_thread::sleep_for(milliseconds(25));
  }
  // No agent hosts it: a plain store (a ddprund), shared by design.
}

std::size_t clear_worker_keys(rdzv::Store& store) {
  std::size_t n = 0;
  for (const auto& k : store.list_keys()) {
    if (is_worker_key(k) && store.delete_key(k)) ++n;
  }
  return n;
}

}  // namespace ddp::launch
