// Session: the per-connection read/dispatch/write loop. Replies are batched per read and sent
// with one write; a client that stops reading is neither parsed nor read from until its
// replies drain (TCP back-pressure). Every byte held for the client (input buffer, replies,
// wait registration) is counted against a per-connection and a global budget, and a started
// request must be finished within the frame deadline.
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
constexpr std::size_t kShrinkAbove = 64 * 1024;  // give back what one big value needed
// A pending WAIT's registration per key: the key twice (the waiter's list and the key's) plus
// two hash-map nodes.
constexpr std::size_t kWaitEntryOverhead = 96;

// The first bytes of every connection are not counted against the global budget, so that a
// well-behaved client (small requests, small replies) is never refused because others have
// taken it all; the global bound is max_client_bytes + this x open connections.
constexpr std::size_t kConnectionAllowance = 64 * 1024;

std::size_t room(std::size_t used, std::size_t cap) { return used >= cap ? 0 : cap - used; }
std::size_t excess(std::size_t held) {
  return held > kConnectionAllowance ? held - kConnectionAllowance : 0;
}

// Heap bytes of a string: an empty one's inline capacity is not memory held for a client.
std::size_t heap_bytes(const std::string& s) {
  static const std::size_t kInline = std::string().capacity();
  return s.capacity() > kInline ? s.capacity() : 0;
}

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

Session::Session(asio::ip::tcp::socket socket, SharedState& shared, WaiterId id, bool admitted)
    : socket_(std::move(socket)),
      shared_(shared),
      id_(id),
      decoder_(shared.limits),
      gate_(shared.key.get(), admitted),
      frame_timer_(socket_.get_executor()) {}

std::string Session::peer() {
  boost::system::error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  if (ec) return "?";
  return ep.address().to_string() + ":" + std::to_string(ep.port());
}

void Session::read() {
  if (reading_ || closing_ || closed_ || output_full()) return;
  if (in_cap_ - in_end_ < kMinReadSpace && !grow_input()) return;
  reading_ = true;
  if (ssl_) return tls_read(in_.get() + in_end_, in_cap_ - in_end_, true);
  socket_.async_read_some(asio::buffer(in_.get() + in_end_, in_cap_ - in_end_),
                          [self = shared_from_this()](const boost::system::error_code& ec,
                                                      std::size_t n) { self->on_read(ec, n); });
}

// Makes room for the next read: compacts, or grows by doubling while the budgets allow, else
// by all that they still allow. False (the connection is closing) when that is not even room
// for one more read.
bool Session::grow_input() {
  const std::size_t used = in_end_ - in_begin_;
  std::size_t cap = std::max(in_cap_, kInitialBuffer);
  while (cap - used < kMinReadSpace || cap < used * 2) cap *= 2;
  if (cap > in_cap_ && !reserve(cap - in_cap_)) {
    // Not the doubling: all the budgets still allow (never a few KiB at a time, which would
    // copy the buffer once per read), if that is room for one more read.
    const std::size_t allowed = room_left();
    cap = in_cap_ + std::min(allowed, cap - in_cap_);
    if (cap < used + kMinReadSpace || !reserve(cap - in_cap_)) {
      over_budget("a request of more than " + std::to_string(used) + " bytes",
                  used + kMinReadSpace - std::min(cap, used + kMinReadSpace) + 1);
      return false;
    }
  }
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
  account();
  return true;
}

bool Session::output_full() const {
  return out_.size() + writing_.size() >= shared_.max_pending_reply_bytes;
}

void Session::account() {
  const std::size_t now = in_cap_ + heap_bytes(out_) + heap_bytes(writing_) + wait_bytes_;
  auto move = [](std::atomic<std::size_t>& total, std::size_t from, std::size_t to) {
    if (to >= from) {
      total.fetch_add(to - from, std::memory_order_relaxed);
    } else {
      total.fetch_sub(from - to, std::memory_order_relaxed);
    }
  };
  move(shared_.client_bytes, held_, now);
  move(shared_.client_excess, excess(held_), excess(now));
  held_ = now;
}

// What this connection may still take: its own budget, and the global one beyond its
// allowance.
std::size_t Session::room_left() const {
  const std::size_t own = room(held_, shared_.max_connection_bytes);
  const std::size_t free = room(held_, kConnectionAllowance);
  const std::size_t global =
      room(shared_.client_excess.load(std::memory_order_relaxed), shared_.max_client_bytes);
  return std::min(own, free + global);
}

// Takes `extra` bytes of both budgets at once (the global one atomically, as sessions on other
// loops take theirs), or nothing.
bool Session::reserve(std::size_t extra) {
  if (extra > room(held_, shared_.max_connection_bytes)) return false;
  const std::size_t more = excess(held_ + extra) - excess(held_);
  const std::size_t before = shared_.client_excess.fetch_add(more, std::memory_order_relaxed);
  if (more > 0 && before + more > shared_.max_client_bytes) {
    shared_.client_excess.fetch_sub(more, std::memory_order_relaxed);
    return false;
  }
  shared_.client_bytes.fetch_add(extra, std::memory_order_relaxed);
  held_ += extra;
  return true;
}

void Session::over_budget(const std::string& what, std::size_t need) {
  shared_.over_budget.fetch_add(1, std::memory_order_relaxed);
  fail(what + " needs " + std::to_string(need) + " more bytes: over the memory budget of one " +
       "connection (" + std::to_string(held_) + " of " +
       std::to_string(shared_.max_connection_bytes) + " bytes held, ddprund " +
       "--max-connection-bytes) or of all connections (" +
       std::to_string(shared_.client_excess.load()) + " of " +
       std::to_string(shared_.max_client_bytes) + " beyond each connection's first " +
       std::to_string(kConnectionAllowance) + ", --max-client-bytes)");
}

// Arms the deadline when a request is left unfinished, re-arms it when a new one was started
// after progress, and disarms it when nothing is left unparsed.
void Session::arm_frame_deadline(bool partial, bool progressed) {
  if (shared_.frame_timeout.count() <= 0) return;
  if (!partial) {
    if (frame_armed_) {
      frame_armed_ = false;
      ++frame_gen_;
      frame_timer_.cancel();
    }
    return;
  }
  if (frame_armed_ && !progressed) return;
  frame_armed_ = true;
  frame_timer_.expires_after(shared_.frame_timeout);
  frame_timer_.async_wait(
      [self = shared_from_this(), gen = ++frame_gen_](const boost::system::error_code& ec) {
        if (ec || gen != self->frame_gen_ || self->closing_ || self->closed_) return;
        self->shared_.frame_timeouts.fetch_add(1, std::memory_order_relaxed);
        self->fail("a request was started but not finished within " +
                   std::to_string(self->shared_.frame_timeout.count()) +
                   " ms (ddprund --frame-timeout)");
      });
}

void Session::on_read(const boost::system::error_code& ec, std::size_t n) {
  reading_ = false;
  if (closed_) {
    in_.reset();
    in_cap_ = in_begin_ = in_end_ = 0;
    account();
    return;
  }
  if (ec) {
    logger("rdzv").debug("connection {}: read ended: {}", peer(), ec.message());
    close();
    return;
  }
  in_end_ += n;
  shared_.bytes_received.fetch_add(n, std::memory_order_relaxed);
  pump();
}

void Session::pump() {
  process();
  shared_.commit();  // the journal holds a change before its reply goes out (a memcpy)
  flush();
  read();
}

void Session::process() {
  bool partial = false, progressed = false;
  while (!closing_ && !closed_ && !output_full()) {
    auto r =
        decoder_.decode(std::span<const char>(in_.get() + in_begin_, in_end_ - in_begin_), req_);
    if (r.status == proto::DecodeStatus::need_more) {
      partial = in_begin_ != in_end_;
      break;
    }
    if (r.status == proto::DecodeStatus::error) {
      fail(r.error);
      return;
    }
    shared_.requests[static_cast<std::size_t>(op_kind(req_.op))].fetch_add(
        1, std::memory_order_relaxed);
    bool go_on = handle(req_);
    in_begin_ += r.consumed;
    progressed = true;
    if (!go_on) return;
  }
  if (closing_ || closed_) return;
  arm_frame_deadline(partial, progressed);
  if (in_begin_ == in_end_) {
    in_begin_ = in_end_ = 0;
    if (in_cap_ > kShrinkAbove) {
      in_.reset();
      in_cap_ = 0;
    }
  }
  account();
}

bool Session::handle(const proto::Request& req) {
  if (!gate(req)) return !closing_;
  if (req.op == Op::cancel_wait) {
    cancel_wait(true);
    return true;
  }
  // Any other request while a wait is pending means the client stopped waiting. torch 1.13
  // does exactly this after a timed-out wait(); dropping the registration here prevents the
  // stray STOP_WAITING that desynchronises 1.13's own server (torch-compat.md §5.5).
  if (wait_pending_) cancel_wait(false);
  if (req.op == Op::hello) status_prefix_ = true;
  if (req.op == Op::validate) {
    // torch's servers drop a client whose VALIDATE is not its first and only one.
    if (validated_) {
      fail("VALIDATE sent twice on one connection");
      return false;
    }
    validated_ = true;
  }
  std::size_t wait_bytes = 0;
  if (req.op == Op::wait || req.op == Op::barrier) {
    for (auto k : req.keys) wait_bytes += 2 * k.size() + kWaitEntryOverhead;
    if (!reserve(wait_bytes)) {
      over_budget(
          std::string(proto::op_name(req.op)) + " on " + std::to_string(req.keys.size()) + " keys",
          wait_bytes);
      return false;
    }
    wait_bytes_ = wait_bytes;  // reserved; dropped below unless the request now waits
  }

  std::size_t mark = out_.size();
  woken_.clear();
  Millis now = needs_clock(req.op) ? shared_.now() : Millis(0);
  DispatchContext ctx{shared_.table, id_, now, status_prefix_, out_, woken_, {}};
  ctx.nonce = gate_.nonce();
  ctx.max_reply = room_left();
  ctx.max_leases = shared_.max_leases_per_connection;
  Outcome outcome;
  std::vector<std::shared_ptr<Session>> wake;
  if (needs_table(req.op)) {
    std::lock_guard<std::mutex> g(shared_.mu);
    outcome = dispatch(req, ctx);
    wake = claim_wakes(shared_, woken_);
  } else {
    outcome = dispatch(req, ctx);
  }
  if (!wake.empty()) shared_.commit();
  post_wakes(wake);
  if (outcome != Outcome::waiting) wait_bytes_ = 0;
  if (outcome == Outcome::failed) {
    out_.resize(mark);
    if (ctx.over_budget) shared_.over_budget.fetch_add(1, std::memory_order_relaxed);
    fail(ctx.error);
    return false;
  }
  if (outcome == Outcome::waiting) wait_pending_ = true;
  const std::size_t before = held_;
  account();
  const bool over_global =
      excess(held_) > excess(before) &&
      shared_.client_excess.load(std::memory_order_relaxed) > shared_.max_client_bytes;
  if (held_ > shared_.max_connection_bytes || over_global) {
    out_.resize(mark);
    out_.shrink_to_fit();
    account();
    over_budget(std::string("the reply to ") + std::string(proto::op_name(req.op)),
                held_ > before ? held_ - before : 0);
    return false;
  }
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
  wait_bytes_ = 0;
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
  wait_bytes_ = 0;
  account();
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
  if (ssl_) return tls_write(0, true);
  asio::async_write(socket_, asio::buffer(writing_),
                    [self = shared_from_this()](const boost::system::error_code& ec,
                                                std::size_t n) { self->on_written(ec, n); });
}

void Session::on_written(const boost::system::error_code& ec, std::size_t n) {
  shared_.bytes_sent.fetch_add(n, std::memory_order_relaxed);
  writing_.clear();
  if (writing_.capacity() > kShrinkAbove || closed_) std::string().swap(writing_);
  account();
  if (ec) {
    logger("rdzv").debug("connection {}: write failed: {}", peer(), ec.message());
    close();
    return;
  }
  pump();  // input held back by a full reply buffer goes on now
}

void Session::close() {
  if (closed_) return;
  closed_ = true;
  ++frame_gen_;
  frame_timer_.cancel();
  boost::system::error_code ec;
  socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ec);
  socket_.close(ec);
  if (!reading_) {  // a read in flight keeps its buffer until its handler runs
    in_.reset();
    in_cap_ = in_begin_ = in_end_ = 0;
  }
  std::string().swap(out_);  // writing_ stays until the write's handler: it is in flight
  wait_bytes_ = 0;
  account();
  std::vector<std::shared_ptr<Session>> wake;
  {
    std::lock_guard<std::mutex> g(shared_.mu);
    Woken woken;  // wills of this connection's leases
    shared_.table.release_owner(id_, woken);
    shared_.sessions.erase(id_);
    wake = claim_wakes(shared_, woken);
  }
  shared_.commit();
  post_wakes(wake);
  shared_.connections_open.fetch_sub(1);
}

void Session::abort() {
  closed_ = true;
  ++frame_gen_;
  frame_timer_.cancel();
  boost::system::error_code ec;
  socket_.close(ec);
}

}  // namespace ddp::rdzv
