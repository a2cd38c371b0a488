// The Gloo backend of the communicator: Gloo's TCP transport, bootstrapped through our store
// by an adapter for Gloo's rendezvous store interface (keys under CommOptions::key_prefix).
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include <cstring>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/worker/comm.hpp"

namespace ddp::worker {
namespace {

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

 private:
  std::uint32_t next_tag() { return tag_++; }

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
