// Runs N ranks as threads (gloo's tests' shape): fn(rank) on each, joins them all, and
// rethrows the first exception a rank threw, naming the rank. Catch2 assertions are not
// thread-safe, so ranks throw and the test asserts after run_ranks returns.
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ddp::test {

inline void run_ranks(int n, const std::function<void(int rank)>& fn) {
  std::mutex mu;
  std::exception_ptr first;
  int first_rank = -1;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        std::lock_guard<std::mutex> g(mu);
        if (!first) {
          first = std::current_exception();
          first_rank = r;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!first) return;
  try {
    std::rethrow_exception(first);
  } catch (const std::exception& e) {
    throw std::runtime_error("rank " + std::to_string(first_rank) + ": " + e.what());
  }
}

}  // namespace ddp::test
