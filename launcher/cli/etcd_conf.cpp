// The etcd-v3 backend's settings (etcd_conf.hpp): members, key prefix, auth, TLS.
#include "ddp/launch/etcd_conf.hpp"

#include <fstream>

#include "ddp/proto/error.hpp"
#include "ddp/proto/knobs.hpp"

namespace ddp::launch {
namespace {

const std::string* conf(const LaunchConfig& c, const std::string& key) {
  auto it = c.rdzv_conf.find(key);
  return it == c.rdzv_conf.end() ? nullptr : &it->second;
}

// key_prefix, or torchrun's spelling etcd_prefix; not both.
std::string key_prefix(const LaunchConfig& c) {
  const std::string* a = conf(c, "key_prefix");
  const std::string* b = conf(c, "etcd_prefix");
  if (a && b) throw ConfigError("--rdzv-conf: give key_prefix or etcd_prefix, not both");
  return a ? *a : b ? *b : std::string();
}

std::string read_password(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("--rdzv-conf password_file=" + path + ": cannot be read");
  std::string line;
  char ch = 0;
  while (in.get(ch) && ch != '\n') {
    if (line.size() >= kMaxEtcdPassword) {
      throw ConfigError("--rdzv-conf password_file=" + path + ": the first line is over " +
                        std::to_string(kMaxEtcdPassword) + " bytes");
    }
    line += ch;
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  if (line.empty()) throw ConfigError("--rdzv-conf password_file=" + path + ": no password");
  return line;
}

}  // namespace

std::vector<Endpoint> etcd_members(const LaunchConfig& c) {
  try {
    return rdzv::etcd::parse_etcd_endpoints(c.rdzv_endpoint);
  } catch (const ConfigError& e) {
    throw ConfigError("--rdzv-endpoint=" + c.rdzv_endpoint + ": " + e.what());
  }
}

rdzv::TlsOptions etcd_tls(const LaunchConfig& c, const knobs::Env* env) {
  bool https = false;
  try {
    rdzv::etcd::parse_etcd_endpoints(c.rdzv_endpoint, &https);
  } catch (const ConfigError& e) {
    throw ConfigError("--rdzv-endpoint=" + c.rdzv_endpoint + ": " + e.what());
  }
  rdzv::TlsOptions t;
  t.cert_hint = "give cert= and key= in --rdzv-conf (or ETCDCTL_CERT and ETCDCTL_KEY)";
  if (const std::string* p = conf(c, "protocol")) {
    if (*p != "http" && *p != "https") {
      throw ConfigError("--rdzv-conf protocol=" + *p + ": expected http or https");
    }
    if (*p == "http" && https) {
      throw ConfigError("--rdzv-conf protocol=http, but --rdzv-endpoint names https:// members");
    }
    https = https || *p == "https";
  }
  t.on = https;
  // Each file: torchrun's key, etcd-v2's alias (not both), else etcdctl's variable.
  const auto file = [&](rdzv::TlsFile& f, const char* key, const char* alias, const char* var) {
    const std::string* a = conf(c, key);
    const std::string* b = conf(c, alias);
    if (a && b) {
      throw ConfigError(std::string("--rdzv-conf: give ") + key + " or " + alias + ", not both");
    }
    if (a || b) {
      if (!https) {
        throw ConfigError(std::string("--rdzv-conf ") + (a ? key : alias) +
                          ": TLS settings need https: give protocol=https or https:// members");
      }
      f.path = a ? *a : *b;
      f.from = std::string("--rdzv-conf ") + (a ? key : alias);
    } else if (https) {
      if (auto v = knobs::text(var, env); v && !v->empty()) {
        f.path = *v;
        f.from = var;
      }
    }
    if (f.path.size() > 4096) throw ConfigError(f.from + ": a path over 4096 bytes");
  };
  file(t.cacert, "cacert", "ca_cert", "ETCDCTL_CACERT");
  file(t.cert, "cert", "ssl_cert", "ETCDCTL_CERT");
  file(t.key, "key", "ssl_cert_key", "ETCDCTL_KEY");
  if (t.cert.path.empty() != t.key.path.empty()) {
    const auto& given = t.cert.path.empty() ? t.key : t.cert;
    throw ConfigError(given.from + "=" + given.path + ": a client certificate and its key go " +
                      "together; give both (cert= and key=)");
  }
  return t;
}

void check_etcd_conf(const LaunchConfig& c) {
  etcd_tls(c);
  const std::string prefix = key_prefix(c);
  if (prefix.size() > kMaxEtcdPrefix) {
    throw ConfigError("--rdzv-conf key_prefix: " + std::to_string(prefix.size()) + " bytes, over " +
                      std::to_string(kMaxEtcdPrefix));
  }
  if (prefix.find('\0') != std::string::npos) {
    throw ConfigError("--rdzv-conf key_prefix: holds a NUL byte");
  }
  const bool password = conf(c, "password") != nullptr;
  const bool file = conf(c, "password_file") != nullptr;
  if (password && file) {
    throw ConfigError("--rdzv-conf: give password or password_file, not both");
  }
  if ((password || file) && !conf(c, "user")) {
    throw ConfigError(std::string("--rdzv-conf ") + (password ? "password" : "password_file") +
                      " without user");
  }
  if (const std::string* u = conf(c, "user"); u && u->empty()) {
    throw ConfigError("--rdzv-conf user: empty");
  }
}

EtcdSettings etcd_settings(const LaunchConfig& c, std::chrono::milliseconds request_timeout) {
  check_etcd_conf(c);
  EtcdSettings s;
  s.options.endpoints = c.etcd_members.empty() ? etcd_members(c) : c.etcd_members;
  s.options.timeout = request_timeout;
  s.options.connect_timeout = std::min(request_timeout, std::chrono::milliseconds(2000));
  if (const std::string* u = conf(c, "user")) {
    s.options.user = *u;
    if (const std::string* p = conf(c, "password")) s.options.password = *p;
    if (const std::string* f = conf(c, "password_file")) s.options.password = read_password(*f);
  }
  s.key_prefix = key_prefix(c);
  s.options.tls = etcd_tls(c);
  return s;
}

}  // namespace ddp::launch
