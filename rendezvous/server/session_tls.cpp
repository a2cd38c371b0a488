// Session's start (session.hpp): with TLS on, the first byte (peeked) tells a TLS handshake
// record (0x16) from a TCPStore request (store_tls.hpp); TLS goes through Asio's SSL stream and
// its handshake, bounded by the frame timeout, before the first read; a plain peer from off the
// host to a TLS-only store is refused at its first request after HELLO, so that a ddprun client
// reads why.
#include <sys/socket.h>

#include <cerrno>

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

void Session::start_tls() {
  tls_ = std::make_unique<asio::ssl::stream<asio::ip::tcp::socket&>>(socket_, *shared_.tls);
  const std::uint64_t gen = ++frame_gen_;
  if (shared_.frame_timeout.count() > 0) {  // a handshake that stalls is a partial frame
    frame_timer_.expires_after(shared_.frame_timeout);
    frame_timer_.async_wait([self = shared_from_this(), gen](const boost::system::error_code& e) {
      if (e || gen != self->frame_gen_ || self->closed_) return;
      self->shared_.frame_timeouts.fetch_add(1, std::memory_order_relaxed);
      self->close();
    });
  }
  reading_ = true;
  tls_->async_handshake(asio::ssl::stream_base::server, [self = shared_from_this(),
                                                         gen](const boost::system::error_code& ec) {
    self->reading_ = false;
    if (gen == self->frame_gen_) {
      ++self->frame_gen_;
      self->frame_timer_.cancel();
    }
    if (self->closed_) return;
    if (ec) {
      self->shared_.audit(Refusal::tls, self->peer() + " (" + ec.message() + ")");
      return self->close();
    }
    self->shared_.tls_connections.fetch_add(1, std::memory_order_relaxed);
    self->gate_.admit();  // its certificate, signed by the job's CA, authenticates it
    self->read();
  });
}

}  // namespace ddp::rdzv
