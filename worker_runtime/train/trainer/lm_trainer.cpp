// The training loop of --model llama (issue 20): the text and its unigram baseline, the mesh,
// each step's global batch (lm_data.hpp) split over the dp ranks, the engine's step, the loss and
// validation perplexity per epoch, snapshots (every SAVE_EVERY epochs, at the end, and on
// SIGTERM/SIGUSR1 agreed by all ranks at a step boundary), and the metrics file with the
// communication each step moved against the formula (docs/ddp_train.md "The language model").
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <ostream>

#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "ddp/worker/progress.hpp"
#include "lm_checkpoint.hpp"
#include "lm_data.hpp"
#include "lm_engine.hpp"
#include "mesh.hpp"
#include "trainer.hpp"

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

// The payload each step hands the collectives on one rank (CountingCommunicator's measure):
// tp: 4 all-reduces of the stream per block (2 forward, 2 backward) and one for the output's
// input, plus the logits' all-gather; dp: the tp-local parameters' gradients once (all-reduce or
// reduce-scatter), plus their all-gather (optimizer, gradients), or full sharding's gathers:
// every unit in forward and every block again in backward.
struct CommFormula {
  std::size_t tp = 0;
  std::size_t dp = 0;
};
CommFormula comm_formula(const LmEngine& e, std::size_t batch) {
  const LmConfig& c = e.config();
  const TpLayout& l = e.layout();
  const std::size_t rows = batch * c.seq_len;
  CommFormula f;
  if (l.tp > 1) {
    const std::size_t reduces = 4 * c.n_layers + (c.tied ? 0 : 1);
    f.tp = 4 * (reduces * rows * c.dim + (c.tied ? 0 : rows * c.vocab));
  }
  if (e.dp_size() > 1) {
    const std::size_t p = 4 * l.local_size;
    std::size_t blocks = 0;
    for (std::size_t u = 1; u <= c.n_layers; ++u) blocks += l.unit_end[u] - l.unit_begin[u];
    switch (e.sharding()) {
      case Sharding::none: f.dp = p; break;
      case Sharding::optimizer:
      case Sharding::gradients: f.dp = 2 * p; break;
      case Sharding::full: f.dp = 2 * p + 4 * blocks; break;
    }
  }
  return f;
}

class LmRun {
 public:
  LmRun(const TrainOptions& o, const TrainContext& c) : o_(o), c_(c), m_(*c.mesh) {}
  int go();

 private:
  bool leader() const { return c_.rank == 0; }
  std::ostream& out() { return *c_.out; }
  void phase(const char* word, std::int64_t step) {
    if (c_.progress != nullptr) c_.progress->report(step, word, -1);
  }
  // Every rank's stop signal and save request, agreed at a step boundary.
  void agree(int& stop, bool& save_now);
  double eval_loss(LmEngine& e);
  double world_sum(double v);

  const TrainOptions& o_;
  const TrainContext& c_;
  MeshComms& m_;
  TextCorpus text_;
};

void LmRun::agree(int& stop, bool& save_now) {
  std::int32_t mine[2] = {c_.stop_signal != nullptr ? c_.stop_signal->load() : 0,
                          c_.save_request != nullptr && c_.save_request->exchange(false) ? 1 : 0};
  stop = mine[0];
  save_now = mine[1] != 0;
  if (c_.comm == nullptr || c_.world < 2) return;
  std::vector<std::int32_t> all(2 * static_cast<std::size_t>(c_.world));
  c_.comm->all_gather(mine, all.data(), sizeof mine);
  for (std::size_t q = 0; q < all.size(); q += 2) {
    if (stop == 0 && all[q] != 0) stop = all[q];
    save_now = save_now || all[q + 1] != 0;
  }
}

double LmRun::world_sum(double v) {
  if (c_.comm == nullptr || c_.world < 2) return v;
  std::vector<double> all(static_cast<std::size_t>(c_.world));
  c_.comm->all_gather(&v, all.data(), sizeof v);
  double s = 0.0;
  for (double x : all) s += x;
  return s;
}

// Mean loss per token over the validation windows; every rank evaluates all of them (the tp
// group and full sharding's gathers are collective).
double LmRun::eval_loss(LmEngine& e) {
  const std::size_t seq = o_.lm.seq_len;
  const std::size_t n = val_window_count(text_.val, seq, o_.eval_seqs);
  const auto chunk = static_cast<std::size_t>(o_.batch_size);
  std::vector<std::int32_t> in(chunk * seq), tg(chunk * seq);
  double sum = 0.0;
  for (std::size_t i = 0; i < n; i += chunk) {
    const std::size_t b = std::min(chunk, n - i);
    for (std::size_t k = 0; k < b; ++k) {
      fill_val_window(text_.val, i + k, seq, in.data() + k * seq, tg.data() + k * seq);
    }
    sum += e.eval(in.data(), tg.data(), b);
  }
  return n == 0 ? 0.0 : sum / static_cast<double>(n * seq);
}

int LmRun::go() {
  const LmConfig& cfg = o_.lm;
  const MeshShape shape = m_.place.shape;
  validate(cfg, shape.tp);
  text_ = load_corpus(o_.text, o_.val_fraction, cfg.seq_len);
  // Count what each group moves.
  auto* tp = m_.tp ? new CountingCommunicator(std::move(m_.tp)) : nullptr;
  auto* dp = m_.dp ? new CountingCommunicator(std::move(m_.dp)) : nullptr;
  m_.tp.reset(tp);
  m_.dp.reset(dp);
  LmEngine e(cfg, tp, dp, o_.sharding, o_.optimizer);
  const double baseline = unigram_baseline(text_, cfg.seq_len, o_.eval_seqs);
  if (leader()) {
    out() << "ddp-train: " << m_.place.describe(m_.hosts) << "\n"
          << "ddp-train: llama dim " << cfg.dim << ", " << cfg.n_layers << " layers, "
          << cfg.n_heads << " heads, ffn " << cfg.ffn() << ", seq " << cfg.seq_len
          << (cfg.tied ? ", tied output" : "") << ": " << lm_param_count(cfg)
          << " parameters; --sharding " << to_string(o_.sharding) << " along dp\n"
          << "ddp-train: text " << o_.text << " (" << text_.files.size()
          << " files): " << text_.train.size() << " bytes to train on, " << text_.val.size()
          << " to validate; unigram baseline: val loss " << std::fixed << std::setprecision(4)
          << baseline << " (ppl " << std::exp(baseline) << ")\n"
          << std::defaultfloat << std::flush;
  }
  const std::optional<Position> resumed = lm_load_or_init(e, o_, c_);
  Position pos = resumed.value_or(Position{});
  if (resumed && leader()) {
    out() << "ddp-train: resumed from " << o_.snapshot << " at epoch " << pos.epoch << " step "
          << pos.step << " (global step " << pos.global_step << ")\n";
  }
  const auto b = static_cast<std::size_t>(o_.batch_size);
  const std::size_t global_batch = b * static_cast<std::size_t>(shape.dp);
  const std::size_t tokens_per_step = global_batch * cfg.seq_len;
  const std::int64_t epoch_steps =
      o_.epoch_steps > 0 ? o_.epoch_steps
                         : std::max<std::int64_t>(
                               1, static_cast<std::int64_t>(text_.train.size() / tokens_per_step));
  const float scale = 1.0f / static_cast<float>(tokens_per_step);
  const std::size_t g0 = static_cast<std::size_t>(e.dp_rank()) * b;
  std::vector<std::int32_t> in(b * cfg.seq_len), tg(b * cfg.seq_len);
  const CommFormula formula = comm_formula(e, b);
  CountingCommunicator::Counts tp_step, dp_step;
  std::vector<double> step_losses, val_losses;
  std::optional<Position> last_saved;
  auto save = [&](const char* why) {
    if (o_.snapshot.empty() || (last_saved && *last_saved == pos)) return;
    phase("checkpoint", pos.global_step);
    lm_save(e, o_, c_, m_.place, pos);
    last_saved = pos;
    if (leader()) {
      out() << "ddp-train: snapshot " << o_.snapshot << " written (" << why << "): epoch "
            << pos.epoch << " step " << pos.step << " global step " << pos.global_step << "\n"
            << std::flush;
    }
  };
  const auto t0 = Clock::now();
  Clock::time_point t1 = t0;         // after the first step: tokens/s leaves out the warm-up
  Clock::time_point last_step = t0;  // the progress line's tokens/s
  std::int64_t steps = 0;
  int stop = 0;
  bool done = false;
  double epoch_sum = 0.0;
  std::int64_t epoch_n = 0;
  while (!done && pos.epoch < o_.total_epochs) {
    while (pos.step < epoch_steps) {
      bool save_now = false;
      agree(stop, save_now);
      if (save_now) save("SIGUSR1");
      if (stop != 0) break;
      if (o_.fault.kind == FaultKind::kill && o_.fault.rank == c_.rank &&
          o_.fault.step == pos.global_step && c_.restart_count == 0) {
        ::raise(SIGKILL);
      }
      phase("compute", pos.global_step);
      fill_batch(text_.train, o_.seed, pos.global_step, g0, b, cfg.seq_len, in.data(), tg.data());
      if (tp != nullptr) tp->reset();
      if (dp != nullptr) dp->reset();
      const double local = e.step(in.data(), tg.data(), b, scale);
      if (tp != nullptr) tp_step = tp->counts();
      if (dp != nullptr) dp_step = dp->counts();
      // The tp group's ranks hold the same loss: count it once per dp rank.
      const double loss =
          world_sum(e.layout().rank == 0 ? local : 0.0) / static_cast<double>(tokens_per_step);
      step_losses.push_back(loss);
      if (c_.progress != nullptr) {  // on the next line; the ranks' tokens/s add up to the job's
        const auto now = Clock::now();
        const double dt = std::chrono::duration<double>(now - last_step).count();
        last_step = now;
        c_.progress->metric("loss", loss);
        if (dt > 0) {
          c_.progress->metric("tokens_per_s",
                              static_cast<double>(tokens_per_step) / std::max(1, c_.world) / dt);
        }
      }
      epoch_sum += loss;
      ++epoch_n;
      ++pos.step;
      ++pos.global_step;
      if (++steps == 1) t1 = Clock::now();
      const std::int64_t every =
          o_.log_every > 0 ? o_.log_every : std::max<std::int64_t>(1, epoch_steps / 10);
      if (leader() && (pos.step % every == 0 || pos.step == epoch_steps)) {
        out() << "ddp-train: epoch " << pos.epoch << " step " << pos.step << "/" << epoch_steps
              << " loss " << std::setprecision(5) << loss << std::defaultfloat << "\n"
              << std::flush;
      }
      if (o_.max_steps > 0 && steps >= o_.max_steps) {
        done = true;
        break;
      }
    }
    if (stop != 0) break;
    if (pos.step >= epoch_steps) {
      phase("eval", pos.global_step);
      const double val = o_.eval ? eval_loss(e) : 0.0;
      val_losses.push_back(val);
      if (c_.progress != nullptr && o_.eval) c_.progress->metric("val_loss", val);
      if (leader()) {
        out() << "ddp-train: epoch " << pos.epoch << ": train loss " << std::setprecision(5)
              << (epoch_n > 0 ? epoch_sum / static_cast<double>(epoch_n) : 0.0);
        if (o_.eval) out() << ", val loss " << val << ", val ppl " << std::exp(val);
        out() << std::defaultfloat << "\n" << std::flush;
      }
      epoch_sum = 0.0;
      epoch_n = 0;
      ++pos.epoch;
      pos.step = 0;
      if (o_.save_every > 0 && pos.epoch % o_.save_every == 0) save("epoch end");
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double timed = std::chrono::duration<double>(Clock::now() - t1).count();
  save(stop != 0 ? "stopped by a signal" : "end of training");
  const double val = o_.eval ? eval_loss(e) : 0.0;
  const auto fp = e.fingerprint();
  if (leader()) {
    const double tps =
        steps > 1 && timed > 0.0
            ? static_cast<double>((steps - 1) * static_cast<std::int64_t>(tokens_per_step)) / timed
            : 0.0;
    out() << "ddp-train: " << steps << " steps in " << std::setprecision(4) << secs << " s (" << tps
          << " tokens/s); val loss " << val << " (ppl " << std::exp(val) << ", unigram baseline "
          << baseline << ")" << std::defaultfloat << "\n"
          << std::flush;
    if (!o_.metrics_json.empty()) {
      nlohmann::json j;
      j["model"] = "llama";
      j["mesh"] = {{"dp", shape.dp}, {"tp", shape.tp}};
      j["sharding"] = to_string(o_.sharding);
      j["optimizer"] = to_string(o_.optimizer.kind);
      j["lr"] = o_.optimizer.lr;
      j["lr_gamma"] = o_.lr_gamma;
      j["params"] = lm_param_count(cfg);
      j["world_size"] = c_.world;
      j["steps"] = steps;
      j["global_step"] = pos.global_step;
      j["step_losses"] = step_losses;
      j["val_losses"] = val_losses;
      j["val_loss"] = val;
      j["val_ppl"] = std::exp(val);
      j["unigram_val_loss"] = baseline;
      j["seconds"] = secs;
      j["tokens_per_s"] = tps;
      j["fingerprint"] = {fp.first, fp.second};
      j["comm"] = {{"tp",
                    {{"measured_bytes_per_step", tp_step.total()},
                     {"formula_bytes_per_step", formula.tp},
                     {"all_reduce_bytes", tp_step.all_reduce_bytes},
                     {"all_gather_bytes", tp_step.all_gather_bytes}}},
                   {"dp",
                    {{"measured_bytes_per_step", dp_step.total()},
                     {"formula_bytes_per_step", formula.dp},
                     {"all_reduce_bytes", dp_step.all_reduce_bytes},
                     {"reduce_scatter_bytes", dp_step.reduce_scatter_bytes},
                     {"all_gather_bytes", dp_step.all_gather_bytes}}}};
      if (resumed) j["resumed_from"] = {resumed->epoch, resumed->step, resumed->global_step};
      std::ofstream f(o_.metrics_json);
      f << j.dump(1) << "\n";
      if (!f) throw IoError("cannot write " + o_.metrics_json);
    }
  }
  return stop != 0 ? 128 + stop : 0;
}

}  // namespace

int train_lm(const TrainOptions& o, const TrainContext& c) {
  if (c.mesh == nullptr) throw ConfigError("--model llama: no mesh (internal)");
  LmRun run(o, c);
  return run.go();
}

}  // namespace ddp::train
