// The etcd-v3 backend's settings from the command line (docs/rendezvous.md): the members of
// --rdzv-endpoint, and the --rdzv-conf keys torchrun's etcd backends take (etcd_prefix, protocol,
// cacert/cert/key) with ddprun's own (key_prefix, user, password, password_file). Pure but for
// reading password_file and the ETCDCTL_* variables; tested without etcd.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "ddp/launch/config.hpp"
#include "ddp/proto/knobs.hpp"
#include "ddp/rdzv/etcd/http.hpp"

namespace ddp::launch {

inline constexpr std::size_t kMaxEtcdPrefix = 256;     // key_prefix, in bytes
inline constexpr std::size_t kMaxEtcdPassword = 4096;  // password_file's first line

// --rdzv-endpoint as etcd members (port 2379 when none is given); ConfigError naming the bad one.
std::vector<Endpoint> etcd_members(const LaunchConfig& c);

// Refuses, by name, what the backend cannot take: a bad protocol or TLS file setting (etcd_tls), a
// key prefix that is too long or has a NUL, a password without a user, both password and
// password_file. Called with the other bounds (check_counts) for an etcd-v3 config.
void check_etcd_conf(const LaunchConfig& c);

// TLS to etcd: on for https:// members or protocol=https (http: the default, torchrun's). The
// CA bundle, the client certificate and its key from --rdzv-conf (torchrun's cacert, cert, key;
// etcd-v2's ca_cert, ssl_cert, ssl_cert_key), else etcdctl's ETCDCTL_CACERT, ETCDCTL_CERT and
// ETCDCTL_KEY (`env`, or the process's). Throws ConfigError for a protocol other than http or
// https, http with https:// members, a key and its alias both, a TLS file with TLS off, a
// certificate without its key or the reverse. The files themselves are checked when the client
// starts (rdzv/etcd/tls.hpp).
rdzv::TlsOptions etcd_tls(const LaunchConfig& c, const knobs::Env* env = nullptr);

struct EtcdSettings {
  rdzv::etcd::EtcdOptions options;  // members, timeouts, auth
  std::string key_prefix;           // before every key the rendezvous writes ("": none)
};
// The client's settings: each request bounded by `request_timeout` (every member tried).
EtcdSettings etcd_settings(const LaunchConfig& c, std::chrono::milliseconds request_timeout);

}  // namespace ddp::launch
