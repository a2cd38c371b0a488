// TLS contexts and client sessions (tls.hpp): the context's files checked up front, sessions
// whose failures are named, a client's last session kept for resumption.
#include "ddp/rdzv/tls.hpp"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "ddp/proto/error.hpp"

namespace ddp::rdzv {

namespace {

// The first error OpenSSL queued (the cause; later ones are consequences), and the queue
// emptied.
unsigned long first_error() {
  const unsigned long code = ERR_peek_error();
  ERR_clear_error();
  return code;
}

std::string reason_of(unsigned long code) {
  if (code == 0) return "no reason given";
  const char* r = ERR_reason_error_string(code);
  return r != nullptr ? r : "error " + std::to_string(ERR_GET_REASON(code));
}

std::string named(const TlsFile& f) { return f.from + "=" + f.path; }

std::string asn1_time(const ASN1_TIME* t) {
  BIO* b = BIO_new(BIO_s_mem());
  if (b == nullptr) return "?";
  ASN1_TIME_print(b, t);
  char* data = nullptr;
  const long n = BIO_get_mem_data(b, &data);
  std::string s(data, static_cast<std::size_t>(n > 0 ? n : 0));
  BIO_free(b);
  return s;
}

void check_readable(const TlsFile& f) {
  if (::access(f.path.c_str(), R_OK) != 0) {
    throw ConfigError(named(f) + ": cannot be read (" + std::strerror(errno) + ")");
  }
}

// The client certificate's validity now, so an expired one is named before the server refuses
// it with a bare "bad certificate".
void check_dates(const TlsFile& f) {
  BIO* b = BIO_new_file(f.path.c_str(), "r");
  X509* x = b != nullptr ? PEM_read_bio_X509(b, nullptr, nullptr, nullptr) : nullptr;
  if (b != nullptr) BIO_free(b);
  if (x == nullptr) {
    throw ConfigError(named(f) + ": not a PEM certificate (" + reason_of(first_error()) + ")");
  }
  std::string problem;
  if (X509_cmp_current_time(X509_get0_notAfter(x)) <= 0) {
    problem = "the certificate expired on " + asn1_time(X509_get0_notAfter(x));
  } else if (X509_cmp_current_time(X509_get0_notBefore(x)) >= 0) {
    problem = "the certificate is not valid before " + asn1_time(X509_get0_notBefore(x));
  }
  X509_free(x);
  if (!problem.empty()) throw ConfigError(named(f) + ": " + problem);
}

bool is_ip_address(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// Where an SSL_CTX points back to its TlsContext: an ex_data slot of our own (Asio's context,
// which wraps a server's SSL_CTX, owns the app_data slot and deletes what it holds).
int self_index() {
  static const int index = SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

// The client's new-session callback: the context keeps the session (its reference) for the
// next connection.
int kept(SSL* ssl, SSL_SESSION* session) {
  auto* self =
      static_cast<const TlsContext*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), self_index()));
  self->keep_session(session);
  return 1;
}

void load_ca(SSL_CTX* ctx, const TlsFile& ca) {
  check_readable(ca);
  if (SSL_CTX_load_verify_locations(ctx, ca.path.c_str(), nullptr) != 1) {
    throw ConfigError(named(ca) + ": no PEM certificate in it (" + reason_of(first_error()) + ")");
  }
}

void load_own(SSL_CTX* ctx, const TlsFile& cert, const TlsFile& key) {
  check_readable(cert);
  check_readable(key);
  check_dates(cert);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.path.c_str()) != 1) {
    throw ConfigError(named(cert) + ": not a PEM certificate (" + reason_of(first_error()) + ")");
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key.path.c_str(), SSL_FILETYPE_PEM) != 1) {
    const unsigned long code = first_error();
    if (ERR_GET_REASON(code) == X509_R_KEY_VALUES_MISMATCH) {
      throw ConfigError(named(key) + " is not the key of " + named(cert));
    }
    throw ConfigError(named(key) + ": not a PEM private key (" + reason_of(code) + ")");
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    throw ConfigError(named(key) + " is not the key of " + named(cert));
  }
}

}  // namespace

TlsContext::TlsContext(const TlsOptions& options, TlsRole role) : o_(options) {
  // OpenSSL's socket BIO writes with write(), not send(MSG_NOSIGNAL): writing to a peer that
  // closed would raise SIGPIPE and end the process. A process that speaks TLS ignores it, as
  // its plain sockets do by MSG_NOSIGNAL, unless it set a handler of its own.
  struct sigaction old {};
  if (::sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  const bool server = role == TlsRole::server;
  if (o_.cert.path.empty() != o_.key.path.empty()) {
    const TlsFile& given = o_.cert.path.empty() ? o_.key : o_.cert;
    throw ConfigError(named(given) + ": a certificate and its key go together; the " +
                      (o_.cert.path.empty() ? "certificate" : "key") + " is missing");
  }
  if (server && (o_.cert.path.empty() || o_.cacert.path.empty())) {
    throw ConfigError(std::string("a TLS store needs its certificate and key and the CA of its ") +
                      "clients; missing: " + (o_.cert.path.empty() ? "the certificate" : "the CA"));
  }
  ctx_ = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
  if (ctx_ == nullptr) throw ConfigError("TLS: " + reason_of(first_error()));
  try {
    SSL_CTX_set_min_proto_version(ctx_, TLS1_2_VERSION);
    SSL_CTX_set_mode(ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE);
    // One recv takes all that has arrived, not a record's header and then its body (two
    // syscalls a record). Its reader must then ask peek(), not poll, whether a record waits.
    if (o_.read_ahead) SSL_CTX_set_read_ahead(ctx_, 1);
    if (server) {
      SSL_CTX_set_num_tickets(ctx_, 1);  // one ticket a connection (OpenSSL sends two)
      // Stateful tickets: the session stays in this context's cache and the ticket names it. A
      // stateless ticket carries the session, the client's certificate with it, and decoding
      // that certificate again at each resumption is most of a resumed handshake's CPU in
      // OpenSSL 3.0 (perf on ddprund during a 4,096-client storm).
      SSL_CTX_set_options(ctx_, SSL_OP_NO_TICKET);
    }
    SSL_CTX_set_ex_data(ctx_, self_index(), this);
    if (server) {
      // Mutual TLS: a client without a certificate signed by the CA is refused.
      SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      static const unsigned char kId[] = "ddprun-store";
      SSL_CTX_set_session_id_context(ctx_, kId, sizeof(kId) - 1);
      load_ca(ctx_, o_.cacert);
      if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(o_.cacert.path.c_str())) {
        SSL_CTX_set_client_CA_list(ctx_, names);
      }
    } else {
      SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
      SSL_CTX_set_session_cache_mode(ctx_,
                                     SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
      SSL_CTX_sess_set_new_cb(ctx_, kept);
      if (o_.cacert.path.empty()) {
        SSL_CTX_set_default_verify_paths(ctx_);
      } else {
        load_ca(ctx_, o_.cacert);
      }
    }
    if (!o_.cert.path.empty()) load_own(ctx_, o_.cert, o_.key);
  } catch (...) {
    SSL_CTX_free(ctx_);
    throw;
  }
}

SSL_SESSION* TlsContext::take_session() const {
  std::lock_guard<std::mutex> g(mu_);
  if (last_ != nullptr) SSL_SESSION_up_ref(last_);
  return last_;
}

void TlsContext::keep_session(SSL_SESSION* s) const {
  std::lock_guard<std::mutex> g(mu_);
  if (last_ != nullptr) SSL_SESSION_free(last_);
  last_ = s;
}

TlsContext::~TlsContext() {
  if (last_ != nullptr) SSL_SESSION_free(last_);
  SSL_CTX_free(ctx_);
}

TlsSession::TlsSession(const TlsContext& ctx, int fd, const std::string& host, std::string where)
    : ctx_(ctx), where_(std::move(where)) {
  ssl_ = SSL_new(ctx.get());
  if (ssl_ == nullptr || SSL_set_fd(ssl_, fd) != 1) {
    if (ssl_ != nullptr) SSL_free(ssl_);
    throw IoError(where_ + ": TLS: " + reason_of(first_error()));
  }
  SSL_set_connect_state(ssl_);
  if (SSL_SESSION* last = ctx.take_session()) {
    SSL_set_session(ssl_, last);
    SSL_SESSION_free(last);
  }
  if (is_ip_address(host)) {  // an IP address must be among the certificate's IP SANs
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), host.c_str());
  } else {  // a name: SNI, and among its DNS SANs
    SSL_set_tlsext_host_name(ssl_, host.c_str());
    SSL_set1_host(ssl_, host.c_str());
  }
}

TlsSession::~TlsSession() { SSL_free(ssl_); }

short TlsSession::handshake() {
  const int rc = SSL_connect(ssl_);
  if (rc == 1) return 0;
  const long r = step(rc, "handshake");
  if (r == 0) throw IoError(where_ + ": the connection was closed during the TLS handshake");
  return static_cast<short>(-r);
}

long TlsSession::write(const void* data, std::size_t n) {
  const int rc = SSL_write(ssl_, data, static_cast<int>(n));
  return rc > 0 ? rc : step(rc, "write");
}

long TlsSession::read(void* data, std::size_t n) {
  const int rc = SSL_read(ssl_, data, static_cast<int>(n));
  return rc > 0 ? rc : step(rc, "read");
}

bool TlsSession::pending() const { return SSL_pending(ssl_) > 0; }

long TlsSession::peek() {
  char c = 0;
  const int rc = SSL_peek(ssl_, &c, 1);
  return rc > 0 ? rc : step(rc, "read");
}

bool TlsSession::resumed() const { return SSL_session_reused(ssl_) == 1; }

// What a failed SSL_* call means: wait (< 0), closed (0), or a named error.
long TlsSession::step(int rc, const char* doing) {
  const int e = SSL_get_error(ssl_, rc);
  if (e == SSL_ERROR_WANT_READ) return -POLLIN;
  if (e == SSL_ERROR_WANT_WRITE) return -POLLOUT;
  if (e == SSL_ERROR_ZERO_RETURN) return 0;
  const int saved_errno = errno;
  const unsigned long code = first_error();
  // Closed during the handshake before the server sent a byte: it took the hello for garbage.
  const std::string silent =
      std::string_view(doing) == "handshake" && BIO_number_read(SSL_get_rbio(ssl_)) == 0
          ? " (no TLS answer: a plain peer?)"
          : "";
  if (e == SSL_ERROR_SYSCALL) {
    if (code == 0 && saved_errno == 0 && silent.empty()) return 0;  // EOF without close_notify
    throw IoError(where_ + ": TLS " + doing + ": " +
                  (code != 0     ? reason_of(code)
                   : saved_errno ? std::string(std::strerror(saved_errno))
                                 : std::string("the connection was closed")) +
                  silent);
  }
  const long verify = SSL_get_verify_result(ssl_);
  if (verify != X509_V_OK) {
    const std::string why = X509_verify_cert_error_string(verify);
    if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH) {
      throw ConfigError(where_ + ": its certificate is for another host (" + why +
                        "): it does not name the address connected to");
    }
    const TlsFile& ca = ctx_.options().cacert;
    throw ConfigError(where_ + ": its certificate is not trusted: " + why + " (checked against " +
                      (ca.path.empty() ? std::string("the system's CAs") : named(ca)) + ")");
  }
  const int reason = ERR_GET_REASON(code);
  if (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG ||
      reason == SSL_R_HTTP_REQUEST) {
    throw ConfigError(where_ + " does not speak TLS (a plain peer?): " + reason_of(code));
  }
  if (reason >= SSL_AD_REASON_OFFSET) {  // an alert the server sent: it refused this client
    std::string hint;
    if (ctx_.options().cert.path.empty() && !ctx_.options().cert_hint.empty()) {
      hint = "; it may ask for a client certificate: " + ctx_.options().cert_hint;
    }
    throw ConfigError(where_ + " refused this client's TLS " + doing + ": " + reason_of(code) +
                      hint);
  }
  throw IoError(where_ + ": TLS " + doing + ": " + reason_of(code) + silent);
}

}  // namespace ddp::rdzv
