// One thread that runs a rank's collectives in the order they were posted, so that compute can
// go on while a layer's parameters are gathered (FSDP's prefetch) or its gradients are
// reduce-scattered. Every rank posts the same collectives in the same order (the model's layer
// order), which is what keeps the ranks' collectives matched. A task that throws (a peer gone)
// marks every later task done without running it; wait() rethrows that error.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace ddp::train {

class CommThread {
 public:
  CommThread();
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `task`; returns its ticket (1, 2, ...: later tasks have larger tickets).
  std::uint64_t post(std::function<void()> task);
  // Blocks until the task with this ticket (and so every earlier one) is done; rethrows the
  // first error any task raised. Ticket 0 returns at once.
  void wait(std::uint64_t ticket);
  void wait_all() { wait(posted_); }

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::uint64_t posted_ = 0;
  std::uint64_t done_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ddp::train
