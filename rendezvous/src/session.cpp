// Session: the per-connection read/dispatch/write loop. Replies are batched per read and sent
// with one write; a client that stops reading is not read from until its replies drain.
// Deferred WAIT/BARRIER replies: a waker bumps wakes_issued under the shared lock and posts
// deliver_wakes(); CANCEL_WAIT sends any undelivered STOP_WAITING before WAIT_CANCELED.
#include "session.hpp"

#include <cstring>

#include "ddp/proto/writer.hpp"
#include "ddp/rdzv/log.hpp"
#include "dispatch.hpp"

namespace ddp::rdzv {

namespace asio = boost::asio;
using proto::Op;

namespace {
constexpr std::size_t kInitialBuffer = 4 * 1024;  // requests are tiny; grow for big values
constexpr std::size_t kMinReadSpace = 2 * 1024;
constexpr std::size_t kShrinkAbove = 64 * 1024;          // give back what one big value needed
constexpr std::size_t kMaxPendingOut = 4 * 1024 * 1024;  // stop reading until replies drain

bool needs_table(Op op) { return op != Op::validate && op != Op::ping && op != Op::hello; }

bool needs_clock(Op op) { return op == Op::lease_grant || op == Op::lease_keepalive; }
}  // namespace

std::vector<std::shared_ptr<Session>> claim_wakes(SharedState& shared, const Woken& woken) {
  std::vector<std::shared_ptr<Session>> out;
  for (WaiterId w : woken) {
    auto it = shared.sessions.find(w);
    if (it == shared.sessions.end()) continue;
    if (auto s = it->second.lock()) {
      s->wakes_issued.fetch_add(1);
      out.push_back(std::move(s));
    }
  }
  return out;
}

void post_wakes(std::vector<std::shared_ptr<Session>>& sessions) {
  for (auto& s : sessions) {
    asio::post(s->executor(), [s] { s->deliver_wakes(); });
  }
}

Session::Session(asio::ip::tcp::socket socket, SharedState& shared, WaiterId id)
    : socket_(std::move(socket)), shared_(shared), id_(id), decoder_(shared.limits) {}

// TCP_NODELAY and keep-alive come from the listening socket: accepted sockets inherit them.
void Session::start() { read(); }

std::string Session::peer() {
  boost::system::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  if (ec) return "?";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

void Session::read() {
  if (reading_ || closing_ || closed_) return;
  if (in_cap_ - in_end_ < kMinReadSpace) {
    std::size_t used = in_end_ - in_begin_;
    std::size_t cap = std::max(in_cap_, kInitialBuffer);
    while (cap - used < kMinReadSpace || cap < used * 2) cap *= 2;
    if (cap == in_cap_) {
      std::memmove(in_.get(), in_.get() + in_begin_, used);
    } else {
      std::unique_ptr<char[]> next(new char[cap]);
      if (used > 0) std::memcpy(next.get(), in_.get() + in_begin_, used);
      in_ = std::move(next);
      in_cap_ = cap;
    }
    in_begin_ = 0;
    in_end_ = used;
  }
  reading_ = true;
  socket_.async_read_some(asio::buffer(in_.get() + in_end_, in_cap_ - in_end_),
                          [self = shared_from_this()](const boost::system::error_code& ec,
                                                      std::size_t n) { self->on_read(ec, n); });
}

void Session::on_read(const boost::system::error_code& ec, std::size_t n) {
  reading_ = false;
  if (ec) {
    if (ec != asio::error::eof && ec != asio::error::operation_aborted &&
        ec != asio::error::connection_reset) {
      logger("rdzv").debug("connection {}: read failed: {}", peer(), ec.message());
    }
    close();
    return;
  }
  in_end_ += n;
  process();
  flush();
  if (out_.size() + writing_.size() < kMaxPendingOut) read();
}

void Session::process() {
  while (!closing_ && !closed_) {
    auto r =
        decoder_.decode(std::span<const char>(in_.get() + in_begin_, in_end_ - in_begin_), req_);
    if (r.status == proto::DecodeStatus::need_more) break;
    if (r.status == proto::DecodeStatus::error) {
      fail(r.error);
      return;
    }
    shared_.requests.fetch_add(1, std::memory_order_relaxed);
    bool go_on = handle(req_);
    in_begin_ += r.consumed;
    if (!go_on) return;
  }
  if (in_begin_ == in_end_) {
    in_begin_ = in_end_ = 0;
    if (in_cap_ > kShrinkAbove) {
      in_.reset();
      in_cap_ = 0;
    }
  }
}

bool Session::handle(const proto::Request& req) {
  if (req.op == Op::cancel_wait) {
    cancel_wait(true);
    return true;
  }
  // Any other request while a wait is pending means the client stopped waiting. torch 1.13
  // does exactly this after a timed-out wait(); dropping the registration here prevents the
  // stray STOP_WAITING that desynchronises 1.13's own server (torch-compat.md §5.5).
  if (wait_pending_) cancel_wait(false);
  if (req.op == Op::hello) status_prefix_ = true;

  std::size_t mark = out_.size();
  woken_.clear();
  Millis now = needs_clock(req.op) ? shared_.now() : Millis(0);
  DispatchContext ctx{shared_.table, id_, now, status_prefix_, out_, woken_, {}};
  Outcome outcome;
  std::vector<std::shared_ptr<Session>> wake;
  if (needs_table(req.op)) {
    std::lock_guard<std::mutex> g(shared_.mu);
    outcome = dispatch(req, ctx);
    wake = claim_wakes(shared_, woken_);
  } else {
    outcome = dispatch(req, ctx);
  }
  post_wakes(wake);
  if (outcome == Outcome::failed) {
    out_.resize(mark);
    fail(ctx.error);
    return false;
  }
  if (outcome == Outcome::waiting) wait_pending_ = true;
  return true;
}

void Session::cancel_wait(bool reply) {
  std::uint64_t issued = 0;
  {
    std::lock_guard<std::mutex> g(shared_.mu);
    shared_.table.cancel(id_);
    issued = wakes_issued.load();
  }
  if (reply) {
    proto::Writer w(out_);
    for (; wakes_delivered_ < issued; ++wakes_delivered_) {
      if (status_prefix_) w.u8(proto::kReplyOk);
      w.u8(proto::kStopWaiting);
    }
    if (status_prefix_) w.u8(proto::kReplyOk);
    w.u8(proto::kWaitCanceled);
  }
  wakes_delivered_ = issued;
  wait_pending_ = false;
}

void Session::deliver_wakes() {
  if (closed_ || closing_) return;
  std::uint64_t issued = wakes_issued.load();
  if (wakes_delivered_ >= issued) return;
  proto::Writer w(out_);
  for (; wakes_delivered_ < issued; ++wakes_delivered_) {
    if (status_prefix_) w.u8(proto::kReplyOk);
    w.u8(proto::kStopWaiting);
  }
  wait_pending_ = false;
  flush();
}

void Session::fail(const std::string& why) {
  shared_.protocol_errors.fetch_add(1, std::memory_order_relaxed);
  logger("rdzv").warn("closing connection from {}: {}", peer(), why);
  if (status_prefix_) proto::Writer(out_).u8(proto::kReplyError).bytes(why);
  closing_ = true;
  flush();
}

void Session::flush() {
  if (closed_ || !writing_.empty()) return;
  if (out_.empty()) {
    if (closing_) close();
    return;
  }
  std::swap(out_, writing_);
  asio::async_write(socket_, asio::buffer(writing_),
                    [self = shared_from_this()](const boost::system::error_code& ec, std::size_t) {
                      self->writing_.clear();
                      if (ec) {
                        self->close();
                        return;
                      }
                      self->flush();
                      if (self->out_.size() < kMaxPendingOut) self->read();
                    });
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  boost::system::error_code ec;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  std::vector<std::shared_ptr<Session>> wake;
  {
    std::lock_guard<std::mutex> g(shared_.mu);
    Woken woken;  // wills of this connection's leases
    shared_.table.release_owner(id_, woken);
    shared_.sessions.erase(id_);
    wake = claim_wakes(shared_, woken);
  }
  post_wakes(wake);
  shared_.connections_open.fetch_sub(1);
}

void Session::abort() {
  closed_ = true;
  boost::system::error_code ec;
  socket_.close(ec);
}

}  // namespace ddp::rdzv
