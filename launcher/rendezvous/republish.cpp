// A store that came back empty (a ddprund restarted without --data-dir): what this node wrote
// for its round (RoundClaims) is written again by Rendezvous::republish, so the running round
// goes on and the next one forms (docs/rendezvous.md, "When the store goes away").
#include <charconv>

#include "ddp/launch/rendezvous.hpp"

namespace ddp::launch {

RoundClaims::Claims RoundClaims::get() const {
  std::lock_guard<std::mutex> g(mu_);
  return c_;
}

void RoundClaims::forming(int round, int arrival, std::string node) {
  std::lock_guard<std::mutex> g(mu_);
  c_ = Claims{};
  c_.round = round;
  c_.arrival = arrival;
  c_.node = std::move(node);
}

void RoundClaims::formed(int members, int group_rank, std::string host) {
  std::lock_guard<std::mutex> g(mu_);
  c_.members = members;
  c_.group_rank = group_rank;
  c_.host = std::move(host);
}

void RoundClaims::master(std::string addr_port) {
  std::lock_guard<std::mutex> g(mu_);
  c_.master = std::move(addr_port);
}

void RoundClaims::finished() {
  std::lock_guard<std::mutex> g(mu_);
  c_.finished = true;
}

bool Rendezvous::republish(rdzv::Store& s) {
  std::lock_guard<std::mutex> one_at_a_time(claims_->republishing());
  const RoundClaims::Claims c = claims_->get();
  if (c.round < 0 || c.arrival <= 0) return false;  // nothing of ours to lose yet
  const int r = c.round;
  const std::string mine = key(r, "node/" + std::to_string(c.arrival));
  if (s.check({mine})) return false;  // the store kept its state (--data-dir, or never left)
  if (c.members == 0) throw StoreStateLost{};
  rdzv::raise_counter(s, prefix_ + "/round", r);
  rdzv::raise_counter(s, key(r, "joined"), c.members);
  s.compare_set(key(r, "seal"), "", std::to_string(c.members));
  s.set(mine, c.node);
  if (!c.master.empty()) s.set(key(r, "master"), c.master);
  if (c.finished && s.add(key(r, "finished"), 1) == c.members) {
    RoundEvent done;
    done.kind = RoundEvent::Kind::done;
    done.host = c.host;
    done.group_rank = c.group_rank;
    s.compare_set(key(r, "event"), "", encode(done));
  }
  return true;
}

}  // namespace ddp::launch
