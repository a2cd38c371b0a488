// The Gloo backend of the communicator: Gloo's TCP transport, bootstrapped through our store
// by an adapter for Gloo's rendezvous store interface (keys under CommOptions::key_prefix).
// The sharded collectives are direct exchanges over Gloo's unbound buffers (one message per
// pair and part, the reduce-scatter's in segments that overlap the reduction).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/worker/comm.hpp"
#include "sum_parts.hpp"

namespace ddp::worker {
namespace {

// Slot prefixes of our own collectives, apart from Gloo's (0x01-0x08 in gloo/types.h).
constexpr std::uint8_t kReduceScatterSlotPrefix = 0x41;
constexpr std::uint8_t kAllgathervSlotPrefix = 0x42;
constexpr std::uint8_t kExchangeSlotPrefix = 0x43;
// The reduce-scatter's message size: each part travels in segments of this many floats, two
// segments per peer in flight, so the sum of one overlaps the transfer of the next.
constexpr std::size_t kSegment = std::size_t{1} << 18;

// Gloo's rendezvous store over a StoreClient: values are bytes, get waits, wait honours the
// timeout Gloo passes.
class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<rdzv::StoreClient> client, std::string prefix,
                   std::chrono::milliseconds timeout)
      : client_(std::move(client)), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    client_->set(prefix_ + "/" + key, std::string_view(data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    const std::string value = client_->get(prefix_ + "/" + key);
    return {value.begin(), value.end()};
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + "/" + k);
    client_->wait(full, timeout);
  }

 private:
  std::shared_ptr<rdzv::StoreClient> client_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(const CommOptions& o) : rank_(o.rank), size_(o.size) {
    gloo::transport::tcp::attr attr;
    if (!o.iface.empty()) {
      attr.iface = o.iface;
    } else {
      attr.hostname =
          o.local_address.empty() ? local_address_towards(o.route_towards) : o.local_address;
    }
    try {
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank_, size_);
      context->setTimeout(o.timeout);
      GlooStoreAdapter store(o.store, o.key_prefix, o.timeout);
      context->connectFullMesh(store, device);
      context_ = std::move(context);
    } catch (const ddp::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw IoError("gloo: connecting rank " + std::to_string(rank_) + " of " +
                    std::to_string(size_) + " (address " +
                    (attr.iface.empty() ? attr.hostname : "iface " + attr.iface) +
                    ") failed: " + e.what());
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "gloo"; }

  void all_reduce_sum(float* data, std::size_t count) override {
    if (count == 0 || size_ == 1) return;
    run("all_reduce", count * sizeof(float), [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, count);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(next_tag());
      gloo::allreduce(opts);
    });
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    if (bytes == 0 || size_ == 1) return;
    run("broadcast", bytes, [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<char*>(data), bytes);
      opts.setRoot(root);
      opts.setTag(next_tag());
      gloo::broadcast(opts);
    });
  }

  void barrier() override {
    if (size_ == 1) return;
    run("barrier", 0, [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      gloo::barrier(opts);
    });
  }

  void all_gather(const void* in, void* out, std::size_t bytes) override {
    if (size_ == 1) {
      if (bytes != 0 && in != out) std::memcpy(out, in, bytes);
      return;
    }
    if (bytes == 0) return;
    run("all_gather", bytes, [&] {
      gloo::AllgatherOptions opts(context_);
      opts.setInput(const_cast<char*>(static_cast<const char*>(in)), bytes);
      opts.setOutput(static_cast<char*>(out), bytes * static_cast<std::size_t>(size_));
      opts.setTag(next_tag());
      gloo::allgather(opts);
    });
  }

  void reduce_scatter_sum(const float* in, float* out,
                          const std::vector<std::size_t>& counts) override {
    const auto off = shard_offsets("reduce_scatter_sum", counts, size_);
    const std::size_t mine = counts[static_cast<std::size_t>(rank_)];
    if (size_ == 1) {
      if (mine != 0 && out != in) std::memmove(out, in, mine * sizeof(float));
      return;
    }
    if (off.back() == 0) return;
    run("reduce_scatter_sum", off.back() * sizeof(float),
        [&] { exchange_and_sum(in, out, counts, off); });
  }

  void all_gather_v(const float* in, float* out, const std::vector<std::size_t>& counts) override {
    const auto off = shard_offsets("all_gather_v", counts, size_);
    const auto r = static_cast<std::size_t>(rank_);
    if (counts[r] != 0 && in != out + off[r]) {
      std::memmove(out + off[r], in, counts[r] * sizeof(float));
    }
    if (size_ == 1 || off.back() == 0) return;
    run("all_gather_v", off.back() * sizeof(float), [&] {
      const std::uint64_t slot = gloo::Slot::build(kAllgathervSlotPrefix, next_tag());
      auto buf = context_->createUnboundBuffer(out, off.back() * sizeof(float));
      int recvs = 0;
      int sends = 0;
      for (int q = 0; q < size_; ++q) {
        const auto uq = static_cast<std::size_t>(q);
        if (q == rank_ || counts[uq] == 0) continue;
        buf->recv(q, slot, off[uq] * sizeof(float), counts[uq] * sizeof(float));
        ++recvs;
      }
      std::unique_ptr<gloo::transport::UnboundBuffer> src;
      if (counts[r] != 0)
        src = context_->createUnboundBuffer(out + off[r], counts[r] * sizeof(float));
      for (int q = 0; q < size_ && counts[r] != 0; ++q) {
        if (q == rank_) continue;
        src->send(q, slot, 0, counts[r] * sizeof(float));
        ++sends;
      }
      const auto timeout = context_->getTimeout();
      for (int i = 0; i < recvs; ++i) expect_done(buf->waitRecv(timeout), "receive");
      for (int i = 0; i < sends; ++i) expect_done(src->waitSend(timeout), "send");
    });
  }

  void exchange(const void* send, std::size_t send_bytes, int to, void* recv,
                std::size_t recv_bytes, int from) override {
    for (const int peer : {to, from}) {
      if (peer < -1 || peer >= size_) {
        throw ConfigError("exchange: rank " + std::to_string(peer) + " is not in a world of " +
                          std::to_string(size_));
      }
    }
    const bool sends = to >= 0 && send_bytes != 0;
    const bool receives = from >= 0 && recv_bytes != 0;
    if (sends && to == rank_) {  // to itself: a copy (then it is also `from`)
      if (!receives || from != rank_ || recv_bytes != send_bytes) {
        throw ConfigError("exchange: a send to itself is received by itself, the same size");
      }
      std::memmove(recv, send, send_bytes);
      next_tag();  // the tags stay in step with the ranks that did transfer
      return;
    }
    run("exchange", send_bytes + recv_bytes, [&] {
      const std::uint64_t slot = gloo::Slot::build(kExchangeSlotPrefix, next_tag());
      std::unique_ptr<gloo::transport::UnboundBuffer> in;
      std::unique_ptr<gloo::transport::UnboundBuffer> out;
      if (receives) {
        in = context_->createUnboundBuffer(recv, recv_bytes);
        in->recv(from, slot, 0, recv_bytes);
      }
      if (sends) {
        out = context_->createUnboundBuffer(const_cast<void*>(send), send_bytes);
        out->send(to, slot, 0, send_bytes);
      }
      const auto timeout = context_->getTimeout();
      if (in) expect_done(in->waitRecv(timeout), "receive");
      if (out) expect_done(out->waitSend(timeout), "send");
    });
  }

 private:
  std::uint32_t next_tag() { return tag_++; }

  static void expect_done(bool done, const char* what) {
    if (!done) throw std::runtime_error(std::string("a ") + what + " was aborted");
  }

  // Every peer's part goes to it straight from `in`, in segments; this rank's part arrives from
  // every peer into two segments' worth of scratch per peer, and each segment is summed in rank
  // order (this rank's own term read from `in`) while the next one is in flight.
  void exchange_and_sum(const float* in, float* out, const std::vector<std::size_t>& counts,
                        const std::vector<std::size_t>& off) {
    const std::uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, next_tag());
    const auto timeout = context_->getTimeout();
    const auto r = static_cast<std::size_t>(rank_);
    const std::size_t mine = counts[r];
    const auto peers = static_cast<std::size_t>(size_ - 1);
    const std::size_t segments = (mine + kSegment - 1) / kSegment;
    // Receives first: two segments per peer, buffer (j % 2) * peers + k for peer k's segment j.
    std::vector<std::unique_ptr<gloo::transport::UnboundBuffer>> bufs;
    if (segments != 0) {
      scratch_.resize(2 * peers * kSegment);
      for (std::size_t i = 0; i < 2 * peers; ++i) {
        bufs.push_back(context_->createUnboundBuffer(scratch_.data() + i * kSegment,
                                                     kSegment * sizeof(float)));
      }
    }
    auto peer = [&](std::size_t k) { return static_cast<int>(k < r ? k : k + 1); };
    auto segment_size = [&](std::size_t j) { return std::min(kSegment, mine - j * kSegment); };
    auto post = [&](std::size_t j) {
      for (std::size_t k = 0; k < peers; ++k) {
        bufs[(j % 2) * peers + k]->recv(peer(k), slot + j, 0, segment_size(j) * sizeof(float));
      }
    };
    for (std::size_t j = 0; j < std::min<std::size_t>(segments, 2); ++j) post(j);
    std::unique_ptr<gloo::transport::UnboundBuffer> src;
    int sends = 0;
    if (off.back() != mine) {
      src = context_->createUnboundBuffer(const_cast<float*>(in), off.back() * sizeof(float));
      for (std::size_t k = 0; k < peers; ++k) {
        const auto q = static_cast<std::size_t>(peer(k));
        for (std::size_t j = 0; j * kSegment < counts[q]; ++j) {
          const std::size_t n = std::min(kSegment, counts[q] - j * kSegment);
          src->send(peer(k), slot + j, (off[q] + j * kSegment) * sizeof(float), n * sizeof(float));
          ++sends;
        }
      }
    }
    std::vector<const float*> srcs(static_cast<std::size_t>(size_));
    for (std::size_t j = 0; j < segments; ++j) {
      for (std::size_t k = 0; k < peers; ++k) {
        auto& b = bufs[(j % 2) * peers + k];
        expect_done(b->waitRecv(timeout), "receive");
        srcs[static_cast<std::size_t>(peer(k))] = static_cast<const float*>(b->ptr);
      }
      srcs[r] = in + off[r] + j * kSegment;
      detail::sum_in_rank_order(srcs.data(), size_, out + j * kSegment, segment_size(j));
      if (j + 2 < segments) post(j + 2);
    }
    for (int i = 0; i < sends; ++i) expect_done(src->waitSend(timeout), "send");
  }

  template <typename F>
  void run(const char* what, std::size_t bytes, F&& f) {
    if (broken_) throw IoError(std::string("gloo ") + what + ": the communicator failed earlier");
    try {
      f();
    } catch (const std::exception& e) {
      broken_ = true;
      throw IoError(std::string("gloo ") + what + " of " + std::to_string(bytes) +
                    " bytes on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                    " failed (a peer stopped?): " + e.what());
    }
  }

  int rank_;
  int size_;
  std::shared_ptr<gloo::Context> context_;
  std::uint32_t tag_ = 0;
  bool broken_ = false;
  std::vector<float> scratch_;  // the reduce-scatter's receive segments, kept between calls
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const CommOptions& options) {
  if (options.size < 1 || options.rank < 0 || options.rank >= options.size) {
    throw ConfigError("gloo: rank " + std::to_string(options.rank) + " is not in a world of " +
                      std::to_string(options.size));
  }
  if (!options.store) throw ConfigError("gloo: no store to bootstrap through");
  return std::make_unique<GlooCommunicator>(options);
}

}  // namespace ddp::worker
