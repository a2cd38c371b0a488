// A shared-memory all-reduce, reduce-scatter and all-gather for ranks on one host, in front of
// another communicator (Gloo): the ranks map one segment. All-reduce: each copies its chunk in,
// reduces its share of every rank's chunk in a fixed order (so every rank gets the same bits),
// and copies the result out; two barriers per chunk, on counters in the segment. Reduce-scatter
// copies in only the other ranks' parts, and each rank sums only its own part; all-gather copies
// each part in once and out on every other rank; both alternate two halves of the segment, one
// barrier per step. Loopback TCP costs several copies and wake-ups per step; these cost a few
// passes over memory. Broadcast, barrier and the byte all-gather stay with the base. A peer that
// dies is noticed by its pid, so a wait never outlives it.
#include <fcntl.h>
#include <immintrin.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ddp/proto/error.hpp"
#include "ddp/rdzv/client.hpp"
#include "ddp/worker/comm.hpp"
#include "sum_parts.hpp"

namespace ddp::worker {
namespace {

constexpr std::size_t kLine = 64;
// The sharded collectives' piece per rank and step, at most: large enough that a step's barrier
// is cheap against its copies, small enough that a step's data stay in the caches.
constexpr std::size_t kMaxPiece = std::size_t{1} << 16;

class ShmCommunicator final : public Communicator {
 public:
  ShmCommunicator(std::unique_ptr<Communicator> base, void* mem, std::size_t bytes,
                  std::size_t chunk, std::chrono::milliseconds timeout)
      : base_(std::move(base)),
        mem_(static_cast<char*>(mem)),
        bytes_(bytes),
        chunk_(chunk),
        timeout_(timeout),
        rank_(base_->rank()),
        size_(base_->size()),
        srcs_(static_cast<std::size_t>(size_)) {
    pid_at(rank_) = ::getpid();
    // More ranks than CPUs: a spinning waiter holds the CPU a rank it waits for needs; yield
    // almost at once.
    cpu_set_t cpus;
    if (::sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < size_) {
      spin_limit_ = 16;
    }
  }
  ~ShmCommunicator() override {
    leave();  // seen only by a peer still waiting for this rank: one that already arrived
    ::munmap(mem_, bytes_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "gloo+shm"; }

  void all_reduce_sum(float* data, std::size_t count) override {
    if (broken_) throw IoError("shm all_reduce: the communicator failed earlier");
    const auto w = static_cast<std::size_t>(size_);
    for (std::size_t off = 0; off < count; off += chunk_) {
      const std::size_t m = std::min(chunk_, count - off);
      std::memcpy(slot(rank_), data + off, m * sizeof(float));
      arrive_and_wait("all_reduce", count);
      // My share of the chunk: [lo, hi), 16-float aligned so shares do not split cache lines.
      const std::size_t per = ((m + w - 1) / w + 15) / 16 * 16;
      const std::size_t lo = std::min(m, per * static_cast<std::size_t>(rank_));
      const std::size_t hi = std::min(m, lo + per);
      if (lo < hi) {
        // In rank order, as the reduce-scatter: the same bits.
        for (int k = 0; k < size_; ++k) srcs_[static_cast<std::size_t>(k)] = slot(k) + lo;
        detail::sum_in_rank_order(srcs_.data(), size_, result() + lo, hi - lo);
      }
      arrive_and_wait("all_reduce", count);
      std::memcpy(data + off, result(), m * sizeof(float));
      // No third barrier: a rank writes its slot again only for the next chunk, and reaches the
      // result buffer again only after the next first barrier, which every rank passes after
      // copying this result out.
    }
  }
  void reduce_scatter_sum(const float* in, float* out,
                          const std::vector<std::size_t>& counts) override {
    const auto off = shard_offsets("reduce_scatter_sum", counts, size_);
    if (broken_) throw IoError("shm reduce_scatter_sum: the communicator failed earlier");
    const auto r = static_cast<std::size_t>(rank_);
    const auto w = static_cast<std::size_t>(size_);
    const std::size_t largest = *std::max_element(counts.begin(), counts.end());
    // Step k carries piece k of every part: rank q's slot holds, at q' * piece, its piece of
    // part q' for every q' != q; rank r then sums piece k of part r over every slot.
    const std::size_t piece =
        std::max<std::size_t>(1, std::min(kMaxPiece, half_slot() / w / 16 * 16));
    for (std::size_t k = 0; k * piece < largest; ++k) {
      float* mine = vslot(k % 2, rank_);
      for (std::size_t q = 0; q < w; ++q) {
        if (q == r || k * piece >= counts[q]) continue;
        const std::size_t m = std::min(piece, counts[q] - k * piece);
        std::memcpy(mine + q * piece, in + off[q] + k * piece, m * sizeof(float));
      }
      arrive_and_wait("reduce_scatter_sum", off.back());
      if (k * piece < counts[r]) {
        for (std::size_t q = 0; q < w; ++q) {
          srcs_[q] =
              q == r ? in + off[r] + k * piece : vslot(k % 2, static_cast<int>(q)) + r * piece;
        }
        const std::size_t m = std::min(piece, counts[r] - k * piece);
        detail::sum_in_rank_order(srcs_.data(), size_, out + k * piece, m);
      }
    }
    finish_steps("reduce_scatter_sum", largest, off.back());
  }

  void all_gather_v(const float* in, float* out, const std::vector<std::size_t>& counts) override {
    const auto off = shard_offsets("all_gather_v", counts, size_);
    if (broken_) throw IoError("shm all_gather_v: the communicator failed earlier");
    const auto r = static_cast<std::size_t>(rank_);
    const auto w = static_cast<std::size_t>(size_);
    if (counts[r] != 0 && in != out + off[r]) {
      std::memmove(out + off[r], in, counts[r] * sizeof(float));
    }
    const std::size_t largest = *std::max_element(counts.begin(), counts.end());
    // Step k: every rank copies piece k of its part into its slot; the others copy it out.
    const std::size_t piece =
        std::max<std::size_t>(1, std::min(kMaxPiece * w, half_slot() / 16 * 16));
    for (std::size_t k = 0; k * piece < largest; ++k) {
      if (k * piece < counts[r]) {
        const std::size_t m = std::min(piece, counts[r] - k * piece);
        std::memcpy(vslot(k % 2, rank_), out + off[r] + k * piece, m * sizeof(float));
      }
      arrive_and_wait("all_gather_v", off.back());
      for (std::size_t q = 0; q < w; ++q) {
        if (q == r || k * piece >= counts[q]) continue;
        const std::size_t m = std::min(piece, counts[q] - k * piece);
        std::memcpy(out + off[q] + k * piece, vslot(k % 2, static_cast<int>(q)), m * sizeof(float));
      }
    }
    finish_steps("all_gather_v", largest, off.back());
  }

  void broadcast(void* data, std::size_t bytes, int root) override {
    base_->broadcast(data, bytes, root);
  }
  void barrier() override { base_->barrier(); }
  void exchange(const void* send, std::size_t send_bytes, int to, void* recv,
                std::size_t recv_bytes, int from) override {
    base_->exchange(send, send_bytes, to, recv, recv_bytes, from);
  }
  void all_gather(const void* in, void* out, std::size_t bytes) override {
    base_->all_gather(in, out, bytes);
  }

  static std::size_t control_bytes(int size) {
    return (static_cast<std::size_t>(size) * (kLine + sizeof(std::int32_t)) + 4095) / 4096 * 4096;
  }

 private:
  std::atomic_ref<std::uint64_t> seq(int r) {
    return std::atomic_ref<std::uint64_t>(
        *reinterpret_cast<std::uint64_t*>(mem_ + static_cast<std::size_t>(r) * kLine));
  }
  std::int32_t& pid_at(int r) {
    return *reinterpret_cast<std::int32_t*>(mem_ + static_cast<std::size_t>(size_) * kLine +
                                            static_cast<std::size_t>(r) * sizeof(std::int32_t));
  }
  float* slot(int r) {
    return reinterpret_cast<float*>(mem_ + control_bytes(size_) +
                                    static_cast<std::size_t>(r) * chunk_ * sizeof(float));
  }
  float* result() { return slot(size_); }
  // The sharded collectives see the slots and the result as one area in two halves, each with
  // a slot of half_slot() floats per rank (16-float aligned).
  std::size_t half_slot() const {
    return (static_cast<std::size_t>(size_) + 1) * chunk_ / 2 / static_cast<std::size_t>(size_) /
           16 * 16;
  }
  float* vslot(std::size_t half, int r) {
    const std::size_t half_floats = (static_cast<std::size_t>(size_) + 1) * chunk_ / 2;
    return slot(0) + half * half_floats + static_cast<std::size_t>(r) * half_slot();
  }
  // After the last step of a two-halves collective, others may still read the last half; one
  // more barrier before anyone writes the segment again (the next collective).
  void finish_steps(const char* what, std::size_t largest, std::size_t count) {
    if (largest != 0) arrive_and_wait(what, count);
  }

  void arrive_and_wait(const char* what, std::size_t count) {
    ++phase_;
    seq(rank_).store(phase_, std::memory_order_release);
    const auto start = std::chrono::steady_clock::now();
    auto next_check = start + std::chrono::milliseconds(20);
    for (int k = 0; k < size_; ++k) {
      unsigned spins = 0;
      while (seq(k).load(std::memory_order_acquire) < phase_) {
        if (++spins < spin_limit_) {
          _mm_pause();
          continue;
        }
        ::sched_yield();
        if ((spins & 63) != 0) continue;
        const auto now = std::chrono::steady_clock::now();
        if (now < next_check) continue;
        next_check = now + std::chrono::milliseconds(20);
        const std::int32_t pid = std::atomic_ref<std::int32_t>(pid_at(k)).load();
        if (pid == kLeft) {  // alive, but out of this collective after a failure of its own
          leave();
          throw IoError(std::string("shm ") + what + " on rank " + std::to_string(rank_) +
                        ": rank " + std::to_string(k) + " left after a failure");
        }
        if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) {
          leave();
          throw IoError(std::string("shm ") + what + " of " + std::to_string(count) +
                        " floats on rank " + std::to_string(rank_) + " of " +
                        std::to_string(size_) + ": rank " + std::to_string(k) + " (pid " +
                        std::to_string(pid) + ") is gone");
        }
        if (now - start > timeout_) {
          leave();
          throw IoError(std::string("shm ") + what + " on rank " + std::to_string(rank_) +
                        ": rank " + std::to_string(k) + " did not arrive within " +
                        std::to_string(timeout_.count()) + " ms");
        }
      }
    }
  }

  // This rank will not arrive again: waiters on it stop at once (a survivor of a peer's death
  // that rebuilds its communicators leaves this one; the others must not wait out the timeout).
  static constexpr std::int32_t kLeft = -1;
  void leave() {
    broken_ = true;
    std::atomic_ref<std::int32_t>(pid_at(rank_)).store(kLeft);
  }

  std::unique_ptr<Communicator> base_;
  char* mem_;
  std::size_t bytes_;
  std::size_t chunk_;
  std::chrono::milliseconds timeout_;
  int rank_;
  int size_;
  std::vector<const float*> srcs_;  // the terms of a sum, one per rank
  std::uint64_t phase_ = 0;
  unsigned spin_limit_ = 2000;  // pauses before a waiter starts yielding
  bool broken_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator(std::unique_ptr<Communicator> base,
                                                      const CommOptions& o) {
  const int size = base->size();
  const int rank = base->rank();
  // Chunks of up to 4 MB per rank, the whole segment within about 32 MB of /dev/shm.
  std::size_t chunk_bytes = (std::size_t{32} << 20) / static_cast<std::size_t>(size + 1);
  chunk_bytes = std::clamp<std::size_t>(chunk_bytes, 64 << 10, 4 << 20) / 64 * 64;
  const std::size_t chunk = chunk_bytes / sizeof(float);
  const std::size_t bytes =
      ShmCommunicator::control_bytes(size) + static_cast<std::size_t>(size + 1) * chunk_bytes;
  const std::string key = o.key_prefix + "/shm_name";
  std::string name;
  std::string problem;
  int fd = -1;
  if (rank == 0) {
    std::random_device rd;
    name = "/ddp-shm-" + std::to_string(::getpid()) + "-" + std::to_string(rd());
    fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      problem = "shm_open/ftruncate " + name + ": " + std::strerror(errno);
    }
    o.store->set(key, problem.empty() ? name : std::string());
  } else {
    o.store->wait({key}, o.timeout);
    name = o.store->get(key);
    if (name.empty()) {
      problem = "rank 0 could not create the segment";
    } else if ((fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600)) < 0) {
      problem = "shm_open " + name + ": " + std::strerror(errno);
    }
  }
  void* mem = MAP_FAILED;
  if (problem.empty()) {
    mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) problem = std::string("mmap: ") + std::strerror(errno);
  }
  if (fd >= 0) ::close(fd);
  // Everyone must agree: shared memory on every rank, or on none.
  const char ok = problem.empty() ? 1 : 0;
  std::vector<char> all(static_cast<std::size_t>(size));
  base->all_gather(&ok, all.data(), 1);
  if (rank == 0 && !name.empty()) ::shm_unlink(name.c_str());  // mapped by all who could
  const bool everyone = std::all_of(all.begin(), all.end(), [](char c) { return c == 1; });
  if (!everyone) {
    if (mem != MAP_FAILED) ::munmap(mem, bytes);
    if (!problem.empty()) {
      std::fprintf(stderr, "ddp: rank %d: no shared-memory all-reduce (%s); using gloo alone\n",
                   rank, problem.c_str());
    }
    return base;
  }
  return std::make_unique<ShmCommunicator>(std::move(base), mem, bytes, chunk, o.timeout);
}

}  // namespace ddp::worker
