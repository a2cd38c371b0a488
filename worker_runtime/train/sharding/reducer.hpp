// Gradient buckets all-reduced while backward runs, as DDP's Reducer does: whole layers grouped
// into buckets (the first up to 1 MB, then up to the cap), each handed to a communication
// thread the moment backward has produced its last layer. finish() waits for every bucket,
// rethrows a communication error, and averages over the ranks.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "model.hpp"

namespace ddp::worker {
class Communicator;
}

namespace ddp::train {

struct Bucket {
  std::size_t begin = 0;  // range in the flat gradient buffer
  std::size_t end = 0;
  std::size_t last_layer = 0;  // the layer (in forward numbering) whose completion readies it
};

// Pure: buckets over the model's layout (the last layer first), in backward order.
std::vector<Bucket> plan_buckets(const Model& model, std::size_t first_cap_bytes,
                                 std::size_t cap_bytes);

class GradReducer {
 public:
  // comm may be null (one process): finish() then does nothing.
  GradReducer(worker::Communicator* comm, float* grads, std::vector<Bucket> buckets);
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }
  // Backward finished layer `layer` (forward numbering); starts its bucket when complete.
  void layer_done(std::size_t layer);
  void finish();

 private:
  void loop();

  worker::Communicator* comm_;
  float* grads_;
  std::vector<Bucket> buckets_;
  std::size_t launched_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::size_t> queue_;
  std::size_t done_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ddp::train
