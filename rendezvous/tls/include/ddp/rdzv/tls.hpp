// TLS with OpenSSL (issue 35), for the etcd client (etcd/http.cpp) and for ddprun's own store
// connections (client/dialer.cpp; the server's side is server/session.cpp, over Asio). A
// client context checks the server's certificate against a CA bundle (or the system's) and the
// host name or IP address dialed, and may present a certificate of its own (etcd's
// --client-cert-auth, the store's mutual TLS); a server context presents its certificate and
// demands a client certificate signed by its CA. The files are checked when the context is
// made, before any connection: a missing or unreadable file, a key that is not the
// certificate's, a certificate expired or not yet valid are each a ddp::ConfigError naming the
// option that gave it. A session's failures say what went wrong in the same words: the server
// not trusted (and why: unknown CA, expired, another name), the client refused by the server,
// a peer that does not speak TLS. A client context keeps its last session, so a reconnect
// resumes it (no certificate exchange).
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

typedef struct ssl_ctx_st SSL_CTX;  // OpenSSL's, as <openssl/types.h> declares them
typedef struct ssl_st SSL;
typedef struct ssl_session_st SSL_SESSION;

namespace ddp::rdzv {

struct TlsFile {
  std::string path;
  std::string from;  // what gave it, for messages: "--rdzv-conf cacert", "ETCDCTL_CACERT", ...
};

struct TlsOptions {
  bool on = false;  // https:// members; a store's TLS knobs set
  TlsFile cacert;   // PEM CA bundle; empty path: the system's trust store (client only)
  TlsFile cert;     // own certificate (PEM), with key; both or neither (a server: both)
  TlsFile key;
  // Added to "refused this client's TLS handshake" when the client has no certificate: where
  // to give one ("give cert= and key= in --rdzv-conf ...").
  std::string cert_hint;
  // Read all that arrived in one recv (OpenSSL's read-ahead); the reader must use peek().
  bool read_ahead = false;
};

enum class TlsRole : unsigned char { client, server };

class TlsContext {
 public:
  // Throws ddp::ConfigError. A server needs cert, key and cacert (the CA of its clients).
  // Makes the process ignore SIGPIPE when it has the default action (OpenSSL writes with
  // write(), which raises it when the peer closed).
  explicit TlsContext(const TlsOptions& options, TlsRole role = TlsRole::client);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;
  SSL_CTX* get() const { return ctx_; }
  const TlsOptions& options() const { return o_; }
  // A client's last session (null: none yet), offered again by the next TlsSession; any thread.
  SSL_SESSION* take_session() const;
  void keep_session(SSL_SESSION* s) const;

 private:
  TlsOptions o_;
  SSL_CTX* ctx_ = nullptr;
  mutable std::mutex mu_;
  mutable SSL_SESSION* last_ = nullptr;
};

// One client TLS connection over a connected, non-blocking socket (not owned). `where` names
// the peer in messages ("etcd 10.0.0.1:2379"); `host` is what its certificate must name.
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
  // Whether application data can be read now, as read() would say it (> 0: yes; 0: closed;
  // < 0: wait for those poll events), consuming nothing. With read_ahead, the one honest test:
  // whole records may sit in OpenSSL's buffer while the socket is empty.
  long peek();
  bool resumed() const;  // the handshake resumed the context's last session

 private:
  long step(int rc, const char* doing);
  const TlsContext& ctx_;
  SSL* ssl_ = nullptr;
  std::string where_;
};

}  // namespace ddp::rdzv
