// TLS for the etcd client (issue 35): OpenSSL over the client's own non-blocking sockets
// (http.cpp), as etcdctl speaks to a secured cluster: the server's certificate checked against
// a CA bundle (or the system's) and against the member's host name or IP address, and an
// optional client certificate for etcd's --client-cert-auth. The files are checked when the
// context is made, before any connection: a missing or unreadable file, a key that is not the
// certificate's, a certificate expired or not yet valid are each a ddp::ConfigError naming the
// option that gave it. A session's failures say what went wrong in the same words: the server
// not trusted (and why: unknown CA, expired, another name), the client refused by the server,
// a member that does not speak TLS.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

typedef struct ssl_ctx_st SSL_CTX;  // OpenSSL's, as <openssl/types.h> declares them
typedef struct ssl_st SSL;

namespace ddp::rdzv::etcd {

struct TlsFile {
  std::string path;
  std::string from;  // what gave it, for messages: "--rdzv-conf cacert", "ETCDCTL_CACERT", ...
};

struct TlsOptions {
  bool on = false;  // https:// members
  TlsFile cacert;   // PEM CA bundle; empty path: the system's trust store
  TlsFile cert;     // client certificate (PEM), with key; both or neither
  TlsFile key;
};

class TlsContext {
 public:
  explicit TlsContext(const TlsOptions& options);  // throws ddp::ConfigError
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  SSL_CTX* get() const { return ctx_; }
  const TlsOptions& options() const { return o_; }

 private:
  TlsOptions o_;
  SSL_CTX* ctx_ = nullptr;
};

// One TLS connection over a connected, non-blocking socket (not owned). `where` names the
// member in messages ("etcd 10.0.0.1:2379"); `host` is what its certificate must name.
class TlsSession {
 public:
  TlsSession(const TlsContext& ctx, int fd, const std::string& host, std::string where);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // One step of the handshake: 0 when it is done, else the poll events to wait for (POLLIN or
  // POLLOUT). Throws ddp::ConfigError when the peer is not trusted, refuses this client or does
  // not speak TLS; ddp::IoError when the connection broke.
  short handshake();
  // Bytes written or read (> 0); 0 from read: the peer closed; < 0: wait for the poll events
  // -result, then call again. Throws as handshake() does.
  long write(const void* data, std::size_t n);
  long read(void* data, std::size_t n);
  // Decrypted bytes waiting in OpenSSL's buffer (poll would not show them).
  bool pending() const;

 private:
  long step(int rc, const char* doing);
  const TlsContext& ctx_;
  SSL* ssl_ = nullptr;
  std::string where_;
};

}  // namespace ddp::rdzv::etcd
