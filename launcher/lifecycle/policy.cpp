// The round-outcome policy of policy.hpp: the agent's decisions as one pure function, in the
// order of the rules listed there.
#include "ddp/launch/policy.hpp"

#include <algorithm>

namespace ddp::launch {

namespace {

Decision make(Decision::Kind kind, int exit_code = 0, Report report = Report::none,
              bool leave = false) {
  Decision d;
  d.kind = kind;
  d.exit_code = exit_code;
  d.report = report;
  d.leave = leave;
  return d;
}

// The next round after `event` ended this one: a failure counts against --max-restarts, any
// other event re-forms the job with the same count.
Decision next_round(const RoundFacts& f, const RoundEvent& event) {
  Decision d =
      make(event.counts_as_restart() ? Decision::Kind::restart_all : Decision::Kind::reform);
  d.next_restart_count = f.restart_count + (event.counts_as_restart() ? 1 : 0);
  d.next_expect = next_round_expect(event, f.members, f.max_nodes);
  return d;
}

// This node posted its own failure; f.event is the event that held (ours or an earlier one).
Decision after_posting(const RoundFacts& f) {
  if (f.failures.empty() && f.spawn_error.empty() && f.hang &&
      (f.hang->stop_job || !f.restarts_left())) {
    return make(Decision::Kind::stop_and_report, kHangExitCode, Report::hang, true);
  }
  if (!f.restarts_left()) {
    if (!f.failures.empty()) {
      return make(Decision::Kind::stop_and_report, exit_code_for(f.failures), Report::local_summary,
                  true);
    }
    // A spawn error was printed when it was posted; a hang is reported now.
    return make(Decision::Kind::stop_and_report, 1,
                f.spawn_error.empty() && f.hang ? Report::hang : Report::none, true);
  }
  RoundEvent ours;
  ours.kind = RoundEvent::Kind::failure;
  return next_round(f, f.event ? *f.event : ours);
}

}  // namespace

Decision decide(const RoundFacts& f) {
  using Kind = Decision::Kind;
  switch (f.formation) {
    case Formation::timed_out: return make(Kind::stop_and_report, 1, Report::rendezvous_timeout);
    case Formation::spare_not_needed:
      return make(Kind::stop_and_report, 0, Report::spare_not_needed);
    case Formation::formed: break;
  }
  if (f.stop_signal != 0) return make(Kind::exit_on_signal, 128 + f.stop_signal);
  if (f.posted) return after_posting(f);
  if (f.healable()) return make(Kind::heal);
  if (f.local_failure()) return make(Kind::post_failure);
  if (f.solo && f.local_done) return make(Kind::succeed, 0, Report::none, true);
  if (f.event) {
    const RoundEvent& ev = *f.event;
    if (ev.kind == RoundEvent::Kind::done) return make(Kind::succeed, 0, Report::none, true);
    if (ev.kind == RoundEvent::Kind::failure && (!f.restarts_left() || ev.final)) {
      return make(Kind::stop_and_report, ev.exit_code != 0 ? ev.exit_code : 1,
                  Report::remote_failure, true);
    }
    return next_round(f, ev);
  }
  if (f.store_lost) return make(Kind::stop_and_report, 1, Report::store_lost);
  return make(Kind::keep_waiting);
}

RoundEvent failure_event(RoundFacts& f, const std::string& host, int group_rank,
                         int base_global_rank) {
  RoundEvent ours;
  ours.kind = RoundEvent::Kind::failure;
  ours.host = host;
  ours.group_rank = group_rank;
  if (!f.failures.empty()) {
    std::sort(f.failures.begin(), f.failures.end(),
              [](const Failure& a, const Failure& b) { return a.time() < b.time(); });
    const Failure& first = f.failures.front();
    ours.global_rank = first.global_rank;
    ours.local_rank = first.exit.local_rank;
    ours.exit_code = exit_code_for(f.failures);
    ours.what = first.exit.in_words();
  } else if (!f.spawn_error.empty()) {
    ours.local_rank = f.spawn_rank;
    ours.global_rank = base_global_rank + f.spawn_rank;
    ours.exit_code = 1;
    ours.what = "its log directory or file could not be created";
  } else if (f.hang) {
    ours.local_rank = f.hang->local_rank;
    ours.global_rank = f.hang->rank >= 0 ? f.hang->rank : base_global_rank + f.hang->local_rank;
    ours.exit_code = kHangExitCode;
    ours.what = f.hang->what.empty() ? "it stopped making progress" : f.hang->what;
    ours.final = f.hang->stop_job;
  }
  return ours;
}

}  // namespace ddp::launch
