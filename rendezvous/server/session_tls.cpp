// Session's start and its TLS (session.hpp): with TLS on, the first byte (peeked) tells a TLS
// handshake record (0x16) from a TCPStore request (store_tls.hpp). A TLS session is OpenSSL on
// the socket's own non-blocking fd, Asio saying only when the fd is readable or writable: no
// copies through a BIO pair, no extra handler per record. Its handshake is bounded by the frame
// timeout. A plain peer from off the host to a TLS-only store is refused at its first request
// after HELLO, so that a ddprun client reads why.
#include <sys/socket.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <algorithm>
#include <cerrno>

#include "ddp/rdzv/log.hpp"
#include "ddp/rdzv/store_tls.hpp"
#include "session.hpp"

namespace ddp::rdzv {

namespace asio = boost::asio;

// TCP_NODELAY and keep-alive come from the listening socket: accepted sockets inherit them.
void Session::start() {
  if (!shared_.tls) return read();
  reading_ = true;  // the sniff's wait holds the session as a read would
  socket_.async_wait(asio::ip::tcp::socket::wait_read,
                     [self = shared_from_this()](const boost::system::error_code& ec) {
                       self->reading_ = false;
                       if (ec || self->closed_) return self->close();
                       self->sniff();
                     });
}

static bool is_loopback(const asio::ip::address& a) {
  if (a.is_v6() && a.to_v6().is_v4_mapped()) {
    return asio::ip::make_address_v4(asio::ip::v4_mapped, a.to_v6()).is_loopback();
  }
  return a.is_loopback();
}

// The first byte, peeked: a TLS handshake record (0x16) or a TCPStore request (store_tls.hpp).
void Session::sniff() {
  unsigned char first = 0;
  const ssize_t n = ::recv(socket_.native_handle(), &first, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return start();
  if (n <= 0) return close();
  if (first == kTlsRecordHandshake) return start_tls();
  boost::system::error_code ec;
  const auto ep = socket_.remote_endpoint(ec);
  // Refused at its first request after HELLO, so that a ddprun client reads why.
  plain_refused_ = shared_.tls_only && (ec || !is_loopback(ep.address()));
  read();
}

namespace {

// The first error OpenSSL queued, or the certificate check's verdict, in words; the queue
// emptied (it is the thread's, and the next call must find it empty).
std::string tls_reason(SSL* ssl) {
  std::string why;
  const long verify = SSL_get_verify_result(ssl);
  if (verify != X509_V_OK) {
    why = std::string("client certificate: ") + X509_verify_cert_error_string(verify);
  } else if (const unsigned long code = ERR_peek_error(); code != 0) {
    const char* r = ERR_reason_error_string(code);
    why = r != nullptr ? r : "TLS error " + std::to_string(ERR_GET_REASON(code));
  } else {
    why = "the connection closed during the handshake";
  }
  ERR_clear_error();
  return why;
}

}  // namespace

Session::~Session() {
  if (ssl_ != nullptr) SSL_free(ssl_);
}

void Session::start_tls() {
  ssl_ = SSL_new(shared_.tls->get());
  boost::system::error_code ec;
  socket_.native_non_blocking(true, ec);
  if (ssl_ == nullptr || ec || SSL_set_fd(ssl_, socket_.native_handle()) != 1) {
    ERR_clear_error();
    return close();
  }
  SSL_set_accept_state(ssl_);
  const std::uint64_t gen = ++frame_gen_;
  if (shared_.frame_timeout.count() > 0) {  // a handshake that stalls is a partial frame
    frame_timer_.expires_after(shared_.frame_timeout);
    frame_timer_.async_wait([self = shared_from_this(), gen](const boost::system::error_code& e) {
      if (e || gen != self->frame_gen_ || self->closed_) return;
      self->shared_.frame_timeouts.fetch_add(1, std::memory_order_relaxed);
      self->close();
    });
  }
  tls_handshake(gen);
}

void Session::tls_handshake(std::uint64_t gen) {
  ERR_clear_error();
  const int rc = SSL_do_handshake(ssl_);
  if (rc == 1) {
    if (gen == frame_gen_) {
      ++frame_gen_;
      frame_timer_.cancel();
    }
    shared_.tls_connections.fetch_add(1, std::memory_order_relaxed);
    gate_.admit();  // its certificate, signed by the job's CA, authenticates it
    return read();
  }
  const int e = SSL_get_error(ssl_, rc);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    reading_ = true;  // the wait holds the session as a read would
    socket_.async_wait(e == SSL_ERROR_WANT_READ ? asio::ip::tcp::socket::wait_read
                                                : asio::ip::tcp::socket::wait_write,
                       [self = shared_from_this(), gen](const boost::system::error_code& ec) {
                         self->reading_ = false;
                         if (self->closed_) return;
                         if (ec) return self->close();
                         self->tls_handshake(gen);
                       });
    return;
  }
  shared_.audit(Refusal::tls, peer() + " (" + tls_reason(ssl_) + ")");
  close();
}

// Decrypts what has arrived, as many records as fit, into [into, into + n); waits for the
// socket when there is nothing yet. The result goes to on_read.
void Session::tls_read(char* into, std::size_t n, bool posted) {
  std::size_t got = 0;
  boost::system::error_code failed;
  while (got < n) {
    ERR_clear_error();
    const int r =
        SSL_read(ssl_, into + got, static_cast<int>(std::min<std::size_t>(n - got, 1 << 30)));
    if (r > 0) {
      got += static_cast<std::size_t>(r);
      if (SSL_has_pending(ssl_) != 1) break;  // nothing buffered: no recv that would find none
      continue;
    }
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      if (got > 0) break;
      socket_.async_wait(e == SSL_ERROR_WANT_READ ? asio::ip::tcp::socket::wait_read
                                                  : asio::ip::tcp::socket::wait_write,
                         [self = shared_from_this(), into, n](const boost::system::error_code& ec) {
                           if (ec || self->closed_) {
                             return self->on_read(ec ? ec : asio::error::operation_aborted, 0);
                           }
                           self->tls_read(into, n, false);
                         });
      return;
    }
    if (got > 0) break;  // the error comes again at the next read
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)) {
      failed = asio::error::eof;
    } else {
      logger("rdzv").debug("connection {}: TLS read: {}", peer(), tls_reason(ssl_));
      failed = asio::error::connection_reset;
    }
    ERR_clear_error();
    break;
  }
  if (!posted) return on_read(failed, got);
  asio::post(socket_.get_executor(),
             [self = shared_from_this(), failed, got] { self->on_read(failed, got); });
}

// Encrypts writing_ from `off` on; waits for the socket when it is full. The result goes to
// on_written.
void Session::tls_write(std::size_t off, bool posted) {
  boost::system::error_code failed;
  while (off < writing_.size()) {
    ERR_clear_error();
    const int r =
        SSL_write(ssl_, writing_.data() + off,
                  static_cast<int>(std::min<std::size_t>(writing_.size() - off, 1 << 30)));
    if (r > 0) {
      off += static_cast<std::size_t>(r);
      continue;
    }
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      socket_.async_wait(e == SSL_ERROR_WANT_WRITE ? asio::ip::tcp::socket::wait_write
                                                   : asio::ip::tcp::socket::wait_read,
                         [self = shared_from_this(), off](const boost::system::error_code& ec) {
                           if (ec || self->closed_) {
                             return self->on_written(ec ? ec : asio::error::operation_aborted, off);
                           }
                           self->tls_write(off, false);
                         });
      return;
    }
    logger("rdzv").debug("connection {}: TLS write: {}", peer(), tls_reason(ssl_));
    failed = asio::error::broken_pipe;
    break;
  }
  if (!posted) return on_written(failed, off);
  asio::post(socket_.get_executor(),
             [self = shared_from_this(), failed, off] { self->on_written(failed, off); });
}

}  // namespace ddp::rdzv
