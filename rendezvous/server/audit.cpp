// The store's access audit: each refusal counted by reason, and logged as one line naming the
// peer and the reason, at most 10 lines each 10 s so that a scan or a storm of bad clients
// cannot flood the log; the lines held back are counted in the next one written.
#include "ddp/rdzv/log.hpp"
#include "session.hpp"

namespace ddp::rdzv {

void SharedState::audit(Refusal why, const std::string& peer) {
  refusals[static_cast<std::size_t>(why)].fetch_add(1, std::memory_order_relaxed);
  std::uint64_t held = 0;
  {
    std::lock_guard<std::mutex> g(audit_mu);
    if (!audit_limit.allow(std::chrono::steady_clock::now(), held)) return;
  }
  if (held > 0) {
    logger("rdzv").warn("refused a connection from {}: {} ({} more refusals not logged)", peer,
                        refusal_name(why), held);
  } else {
    logger("rdzv").warn("refused a connection from {}: {}", peer, refusal_name(why));
  }
}

}  // namespace ddp::rdzv
