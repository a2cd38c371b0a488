// The store's TLS knobs (store_tls.hpp): read and checked together.
#include "ddp/rdzv/store_tls.hpp"

#include <string>

#include "ddp/proto/error.hpp"

namespace ddp::rdzv {

StoreTls store_tls(const knobs::Env* env) {
  StoreTls t;
  const struct {
    const char* name;
    TlsFile* file;
  } knobs_[] = {{"DDPRUN_STORE_TLS_CERT", &t.files.cert},
                {"DDPRUN_STORE_TLS_KEY", &t.files.key},
                {"DDPRUN_STORE_TLS_CA", &t.files.cacert}};
  std::string set, unset;
  for (const auto& k : knobs_) {
    auto v = knobs::text(k.name, env);
    if (v && v->empty()) throw ConfigError(std::string(k.name) + " is set but empty");
    std::string& list = v ? set : unset;
    list += (list.empty() ? "" : ", ") + std::string(k.name);
    if (v) *k.file = TlsFile{*v, k.name};
  }
  if (!set.empty() && !unset.empty()) {
    throw ConfigError(
        "TLS on the store needs DDPRUN_STORE_TLS_CERT, DDPRUN_STORE_TLS_KEY and "
        "DDPRUN_STORE_TLS_CA together; " +
        set + " set, " + unset + " not");
  }
  t.files.on = unset.empty();
  t.only = knobs::flag01("DDPRUN_STORE_TLS_ONLY", env);
  if (t.only && !t.files.on) {
    throw ConfigError(
        "DDPRUN_STORE_TLS_ONLY=1 needs TLS: set DDPRUN_STORE_TLS_CERT, "
        "DDPRUN_STORE_TLS_KEY and DDPRUN_STORE_TLS_CA");
  }
  t.files.read_ahead = true;  // the store's client and server read through peek()/SSL_read
  t.files.cert_hint = "set DDPRUN_STORE_TLS_CERT, DDPRUN_STORE_TLS_KEY and DDPRUN_STORE_TLS_CA";
  return t;
}

std::shared_ptr<const TlsContext> store_client_tls(const knobs::Env* env) {
  const StoreTls t = store_tls(env);
  if (!t.files.on) return nullptr;
  return std::make_shared<const TlsContext>(t.files, TlsRole::client);
}

}  // namespace ddp::rdzv
