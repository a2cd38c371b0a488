// Bucketed, overlapped gradient all-reduce (see reducer.hpp).
#include "reducer.hpp"

#include "ddp/kernels/cpu_ref.hpp"
#include "ddp/worker/comm.hpp"

namespace ddp::train {

std::vector<Bucket> plan_buckets(const Model& model, std::size_t first_cap_bytes,
                                 std::size_t cap_bytes) {
  std::vector<Bucket> out;
  const auto& slots = model.slots();
  std::size_t cap = first_cap_bytes;
  for (std::size_t k = slots.size(); k-- > 0;) {  // backward order = buffer order
    const std::size_t bytes = (slots[k].end - slots[k].w) * sizeof(float);
    if (out.empty() || (out.back().end - out.back().begin) * sizeof(float) + bytes > cap) {
      if (!out.empty()) cap = cap_bytes;
      out.push_back({slots[k].w, slots[k].end, k});
    } else {
      out.back().end = slots[k].end;
      out.back().last_layer = k;
    }
  }
  return out;
}

GradReducer::GradReducer(worker::Communicator* comm, float* grads, std::vector<Bucket> buckets)
    : comm_(comm != nullptr && comm->size() > 1 ? comm : nullptr),
      grads_(grads),
      buckets_(std::move(buckets)) {
  if (comm_ != nullptr) thread_ = std::thread([this] { loop(); });
}

GradReducer::~GradReducer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GradReducer::layer_done(std::size_t layer) {
  if (comm_ == nullptr) return;
  if (launched_ < buckets_.size() && buckets_[launched_].last_layer == layer) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(launched_);
    }
    ++launched_;
    cv_.notify_all();
  }
}

void GradReducer::finish() {
  if (comm_ == nullptr) return;
  // Buckets backward did not launch (none expected) go now, in order.
  while (launched_ < buckets_.size()) layer_done(buckets_[launched_].last_layer);
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_ == buckets_.size() || error_; });
  launched_ = 0;
  done_ = 0;
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    queue_.clear();
    std::rethrow_exception(e);
  }
  lock.unlock();
  const Bucket& last = buckets_.back();
  kernels::cpu::scale(grads_, last.end, 1.0f / static_cast<float>(comm_->size()));
}

void GradReducer::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    const std::size_t b = queue_.front();
    queue_.pop_front();
    if (error_) continue;
    lock.unlock();
    std::exception_ptr err;
    try {
      comm_->all_reduce_sum(grads_ + buckets_[b].begin, buckets_[b].end - buckets_[b].begin);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err) error_ = err;
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace ddp::train
