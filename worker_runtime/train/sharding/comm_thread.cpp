// The rank's collective thread (see comm_thread.hpp).
#include "comm_thread.hpp"

#include <utility>

namespace ddp::train {

CommThread::CommThread() : thread_([this] { loop(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::uint64_t CommThread::post(std::function<void()> task) {
  std::uint64_t ticket = 0;
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(task));
    ticket = ++posted_;
  }
  cv_.notify_all();
  return ticket;
}

void CommThread::wait(std::uint64_t ticket) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket; });
  if (error_) std::rethrow_exception(error_);
}

void CommThread::loop() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    auto task = std::move(queue_.front());
    queue_.pop_front();
    if (!error_) {
      lock.unlock();
      std::exception_ptr err;
      try {
        task();
      } catch (...) {
        err = std::current_exception();
      }
      task = nullptr;  // what it held is released outside the lock
      lock.lock();
      if (err && !error_) error_ = err;
    }
    ++done_;
    cv_.notify_all();
  }
}

}  // namespace ddp::train
