// The reconnection backoff and the outage account of outage.hpp.
#include "ddp/launch/outage.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ddp::launch {

std::chrono::milliseconds Backoff::delay(int attempt, double unit) const {
  const double ceiling =
      std::min(static_cast<double>(cap.count()),
               static_cast<double>(base.count()) * std::pow(2.0, std::clamp(attempt, 0, 40)));
  const double u = std::clamp(unit, 0.0, 1.0);
  return std::chrono::milliseconds(static_cast<long>(u * ceiling));
}

double Jitter::next() {
  // xorshift64*: enough to spread reconnections, not a secret.
  state_ ^= state_ >> 12;
  state_ ^= state_ << 25;
  state_ ^= state_ >> 27;
  return static_cast<double>((state_ * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}

std::string say_seconds(double s) {
  char buf[64];
  if (s < 120) {
    std::snprintf(buf, sizeof(buf), "%.1f s", s);
  } else {
    std::snprintf(buf, sizeof(buf), "%d min %d s", static_cast<int>(s) / 60,
                  static_cast<int>(s) % 60);
  }
  return buf;
}

OutageMonitor::OutageMonitor(std::string where, std::chrono::milliseconds grace, Events events)
    : where_(std::move(where)), grace_(grace), events_(std::move(events)) {}

namespace {
double seconds_between(OutageClock::time_point a, OutageClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

void OutageMonitor::lost(const std::string& who, const std::string& error,
                         OutageClock::time_point now) {
  OutageSummary s;
  std::string line;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!away_.insert(who).second) return;
    if (away_.size() > 1) return;  // the outage another connection reported
    began_ = now;
    ++last_.count;
    last_.error = error;
    line = "ddprun: lost the rendezvous store at " + where_ + " (" + error +
           "); the workers go on while it reconnects (--store-outage-grace=" +
           say_seconds(static_cast<double>(grace_.count()) / 1000) + ")";
    s = summary_locked(now);
  }
  if (events_.say) events_.say(line);
  if (events_.changed) events_.changed(s);
}

void OutageMonitor::back(const std::string& who, OutageClock::time_point now) {
  OutageSummary s;
  std::string line;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (away_.erase(who) == 0 || !away_.empty()) return;
    const double lasted = seconds_between(began_, now);
    ended_total_s_ += lasted;
    last_.last_s = lasted;
    line = "ddprun: the rendezvous store at " + where_ + " is back after " + say_seconds(lasted) +
           " (outage " + std::to_string(last_.count) + "); the job went on";
    s = summary_locked(now);
  }
  if (events_.say) events_.say(line);
  if (events_.changed) events_.changed(s);
}

void OutageMonitor::forget(const std::string& who, OutageClock::time_point now) {
  OutageSummary s;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (away_.erase(who) == 0 || !away_.empty()) return;
    ended_total_s_ += seconds_between(began_, now);
    s = summary_locked(now);
  }
  if (events_.changed) events_.changed(s);
}

std::string OutageMonitor::give_up_message(double lasted, const std::string& error) const {
  if (grace_.count() == 0) return error + "; --store-outage-grace=0: no waiting";
  return "unreachable for " + say_seconds(lasted) + ", longer than --store-outage-grace=" +
         say_seconds(static_cast<double>(grace_.count()) / 1000) + "; " + error;
}

OutageSummary OutageMonitor::summary(OutageClock::time_point now) const {
  std::lock_guard<std::mutex> g(mu_);
  return summary_locked(now);
}

OutageSummary OutageMonitor::summary_locked(OutageClock::time_point now) const {
  OutageSummary s = last_;
  s.away_s = away_.empty() ? -1 : seconds_between(began_, now);
  s.total_s = ended_total_s_ + std::max(0.0, s.away_s);
  return s;
}

}  // namespace ddp::launch
