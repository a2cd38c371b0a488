// ddp-train's training loop (see trainer.hpp and docs/ddp_train.md).
#include "trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>

#include "data.hpp"
#include "ddp/kernels/conv_ref.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "ddp/worker/progress.hpp"
#include "engine.hpp"
#include "checkpoint.hpp"
#include "shard_copies.hpp"
#include "model.hpp"
#include "report.hpp"
#include "sampler.hpp"

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

// How a communicator reports a peer's failure mid-step: IoError (gloo, shm), NcclError (nccl).
bool peer_failed(const Error& e) {
  return e.code() == Errc::io || e.code() == Errc::nccl || e.code() == Errc::peer_gone;
}

// One epoch's running loss: the mean over its optimizer steps.
struct EpochLoss {
  double sum = 0.0;
  std::int64_t steps = 0;
  double mean() const { return steps > 0 ? sum / static_cast<double>(steps) : 0.0; }
};

class Run {
 public:
  Run(const TrainOptions& o, const TrainContext& c)
      : o_(o),
        c_(c),
        engine_(make_engine(o, c)),
        model_(engine_->model()),
        opt_(engine_->optimizer()) {}

  int go();

 private:
  std::ostream& out() { return *c_.out; }
  bool leader() const { return c_.rank == 0; }
  // Setup: the data, then the parameters (initialised or resumed) on every rank.
  void load_data();
  void resume_or_init();
  void announce();
  // The loop: epochs of steps of micro-batches.
  void run_epoch(std::int64_t epoch);
  bool at_step_boundary();
  std::optional<double> step(const std::vector<std::uint32_t>& idx, std::int64_t mb,
                             std::int64_t group_end);
  std::size_t fill_batch(const std::vector<std::uint32_t>& idx, std::size_t first);
  void finish_epoch(std::int64_t epoch, std::int64_t nb, double mean);
  // Snapshots and stopping.
  void save(const Position& at, const char* why);
  void stop_on_signal(int signal, bool snapshot = true);
  bool heal_from(const Error& e);
  void kill_if(FaultKind kind, std::int64_t n, const char* where);
  void join_as_replacement();
  void agree_at_boundary(int& stop, bool& save_now);
  bool being_stopped(std::chrono::milliseconds wait = std::chrono::seconds(1)) const;
  // Reporting.
  void phase(const char* word, std::int64_t step, std::int64_t samples = -1) {
    if (c_.progress != nullptr) c_.progress->report(step, word, samples);
  }
  void progress(std::int64_t epoch, std::int64_t mb, std::int64_t nb, double loss, bool end);
  void report(double secs, std::uint64_t checksum);

  const TrainOptions& o_;
  TrainContext c_;  // a copy: in-place recovery replaces its communicator
  Dataset train_;
  Dataset test_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<ShardCopies> copies_;  // sharded, in place: the shard copies
  Model& model_;                         // the host copy (engine.hpp)
  Optimizer& opt_;
  Position start_;
  bool resumed_ = false;
  std::optional<Position> last_saved_;
  Clock::time_point t0_;
  std::int64_t samples_ = 0;  // this run, all ranks
  // The loop's state.
  Position pos_;
  std::int64_t steps_this_run_ = 0;
  double last_loss_ = 0.0;
  std::vector<double> epoch_losses_;
  std::vector<double> step_losses_;  // rank 0's loss of each step of this run (the first 100k)
  bool stopping_ = false;            // a signal, --max-steps, or a peer that stopped ahead of us
  bool healed_ = false;              // step() dropped its step and healed: pos_ is the sender's
  int exit_code_ = 0;                // 128 + signal when a signal stopped the run
  std::vector<float> xb_;            // one micro-batch: inputs, labels, regression targets
  std::vector<std::uint8_t> lb_;
  std::vector<float> yb_;
};

void Run::load_data() {
  switch (o_.dataset) {
    case DatasetKind::fashion_mnist:
      train_ = load_fashion_mnist(o_.data_dir, true, o_.train_subset);
      if (o_.eval && (leader() || engine_->collective_predict())) {
        test_ = load_fashion_mnist(o_.data_dir, false, 0);
      }
      break;
    case DatasetKind::synthetic:
      train_ = make_synthetic(o_.train_subset > 0 ? std::min(o_.train_subset, o_.synthetic_size)
                                                  : o_.synthetic_size);
      break;
  }
  const LayerSpec& first = model_.spec().layers.front();
  if (first.in != train_.dim) {
    throw ConfigError("--model " + to_string(o_.model) + " takes " + std::to_string(first.in) +
                      " inputs; --dataset " + to_string(o_.dataset) + " has " +
                      std::to_string(train_.dim));
  }
  const auto batch = static_cast<std::size_t>(o_.batch_size);
  xb_.resize(batch * train_.dim);
  lb_.resize(batch);
  yb_.resize(batch * model_.spec().layers.back().out);
}

void Run::resume_or_init() {
  if (auto at = load_or_init(*engine_, o_, c_)) {
    resumed_ = true;
    start_ = *at;
    last_saved_ = start_;
    if (leader()) {
      out() << "ddp-train: resuming from snapshot " << o_.snapshot << ": epoch " << start_.epoch
            << " step " << start_.step << " (global step " << start_.global_step << ")\n"
            << std::flush;
    }
  }
}

// Replicated: rank 0 writes. Sharded: every rank writes its shard, at the same positions (the
// callers are collective then: step boundaries agree, see agree_at_boundary()).
void Run::save(const Position& at, const char* why) {
  const bool sharded = engine_->shard_layout() != nullptr;
  if ((!leader() && !sharded) || o_.snapshot.empty()) return;
  if (last_saved_ && *last_saved_ == at) return;
  phase("checkpoint", at.global_step);
  if (c_.restart_count == 0 && c_.heal == 0 &&
      o_.fault.kills(FaultKind::kill_snapshot, c_.rank, at.global_step)) {
    set_before_commit_hook([&] { injected_kill(out(), c_.rank, at.global_step, " mid-snapshot"); });
  }
  save_snapshot(*engine_, o_, c_, at);
  last_saved_ = at;
  if (leader()) {
    out() << "ddp-train: " << (sharded ? "sharded " : "") << "snapshot " << o_.snapshot
          << " written (" << why << "): epoch " << at.epoch << " step " << at.step
          << " global step " << at.global_step << "\n"
          << std::flush;
  }
}

// After a peer vanished mid-step: whether this rank is being stopped too. scancel signals the
// nodes one after another, so a peer may stop at a step boundary before our own signal has
// arrived; it is given a second to arrive before the peer's exit counts as a failure.
bool Run::being_stopped(std::chrono::milliseconds wait) const {
  if (c_.stop_signal == nullptr) return false;
  const auto until = Clock::now() + wait;
  while (c_.stop_signal->load() == 0) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void Run::progress(std::int64_t epoch, std::int64_t mb, std::int64_t nb, double loss, bool end) {
  if (!leader()) return;
  const double secs = std::chrono::duration<double>(Clock::now() - t0_).count();
  const double rate = secs > 0 ? static_cast<double>(samples_) / secs : 0.0;
  print_progress(out(), c_.tty, {epoch, o_.total_epochs, mb, nb, loss, rate, end});
}

// The leader's first line: what trains on what, where, and how.
void Run::announce() {
  if (!leader()) return;
  out() << "ddp-train: " << to_string(o_.model) << " (" << model_.param_count()
        << " parameters) on " << to_string(o_.dataset) << " (" << train_.n
        << " samples), world size " << c_.world << ", batch " << o_.batch_size << " per rank, "
        << to_string(opt_.config().kind) << " lr " << opt_.config().lr << ", "
        << engine_->bucket_count() << " gradient bucket(s), backend "
        << (c_.device_comm != nullptr ? c_.device_comm->backend()
            : c_.comm != nullptr      ? c_.comm->backend()
                                      : "none")
        << ", device " << engine_->device() << ", sharding " << to_string(engine_->sharding())
        << (o_.device == Device::cuda ? ", precision " + to_string(o_.precision) : std::string())
        << "\n"
        << std::flush;
}

int Run::go() {
  load_data();
  if (engine_->shard_layout() != nullptr && c_.reconnect && o_.shard_copy_every > 0 &&
      c_.comm != nullptr) {
    copies_ = std::make_unique<ShardCopies>();
  }
  if (c_.heal > 0 && c_.reconnect) {
    join_as_replacement();
  } else {
    resume_or_init();
    if (copies_) keep_shard_copy(*engine_, *c_.comm, *copies_, start_);
  }
  announce();
  pos_ = start_;
  t0_ = Clock::now();
  // From here on a death of this rank is healed in place (before: a start-up failure, which a
  // replacement would only repeat, restarts the job).
  if (c_.reconnect && c_.progress != nullptr) c_.progress->declare("recover=in_place");
  // Each epoch ends at finish_epoch() (pos_ moves to the next) or by stopping_; a heal may move
  // pos_ to where the survivor that sent the state was.
  while (pos_.epoch < o_.total_epochs && !stopping_) run_epoch(pos_.epoch);
  const double secs = std::chrono::duration<double>(Clock::now() - t0_).count();
  if (exit_code_ != 0) return exit_code_;
  save(pos_, "end of run");
  const std::uint64_t checksum = engine_->param_checksum();  // collective when sharded
  if (leader()) {
    report(secs, checksum);
  } else if (o_.eval && engine_->collective_predict()) {
    std::ostringstream quiet;  // the evaluation gathers every layer: every rank takes part
    nlohmann::json ignored;
    evaluate(*engine_, test_, quiet, ignored);
  }
  return 0;
}

// One epoch of this rank's shard, from pos_ (mid-epoch after a resume), one optimizer step of
// --grad-accum micro-batches at a time.
void Run::run_epoch(std::int64_t epoch) {
  const auto B = static_cast<std::size_t>(o_.batch_size);
  const auto K = static_cast<std::int64_t>(o_.grad_accum);
  const auto idx =
      shard_indices(train_.n, c_.world, c_.rank, o_.seed, static_cast<std::uint64_t>(epoch));
  const auto nb = static_cast<std::int64_t>((idx.size() + B - 1) / B);
  const std::int64_t log_every =
      o_.log_every > 0 ? o_.log_every : std::max<std::int64_t>(1, nb / 10);
  if (c_.progress != nullptr) {  // the run's total steps, for the agent's ETA
    const std::int64_t total = o_.total_epochs * ((nb + K - 1) / K);
    c_.progress->set_total(o_.max_steps > 0 ? std::min(total, start_.global_step + o_.max_steps)
                                            : total);
  }
  // --lr-gamma: StepLR(step_size=1), counted from the job's first epoch so a resume continues it.
  opt_.set_lr(
      static_cast<float>(static_cast<double>(o_.optimizer.lr) *
                         std::pow(static_cast<double>(o_.lr_gamma), static_cast<double>(epoch))));
  EpochLoss loss;
  std::int64_t mb = pos_.step;  // 0, or mid-epoch after a resume or a heal
  while (mb < nb) {
    if (!at_step_boundary()) break;
    const std::int64_t group_end = std::min<std::int64_t>(nb, mb + K);
    const auto step_loss = step(idx, mb, group_end);
    if (!step_loss && healed_) {  // the step was dropped: go on from the state received
      healed_ = false;
      if (pos_.epoch != epoch) return;  // the sender had begun the next epoch
      mb = pos_.step;
      continue;
    }
    if (!step_loss) break;  // stopped: a peer stopped one step boundary ahead of us
    const auto group = static_cast<double>(group_end - mb);
    mb = group_end;
    ++steps_this_run_;
    pos_ = {epoch, mb, pos_.global_step + 1};
    if (copies_ && pos_.global_step % o_.shard_copy_every == 0) {
      keep_shard_copy(*engine_, *c_.comm, *copies_, pos_);
    }
    last_loss_ = *step_loss / group;
    loss.sum += last_loss_;
    if (step_losses_.size() < 100000) step_losses_.push_back(last_loss_);
    ++loss.steps;
    if (!std::isfinite(last_loss_)) {
      throw ConfigError("the loss is " + std::to_string(last_loss_) + " at step " +
                        std::to_string(pos_.global_step) + " (a learning rate too high?)");
    }
    if (mb < nb && (pos_.global_step % log_every == 0)) {
      progress(epoch, mb, nb, last_loss_, false);
    }
    if (o_.max_steps > 0 && steps_this_run_ >= o_.max_steps) {
      stopping_ = true;
      break;
    }
  }
  if (exit_code_ != 0) return;
  if (mb >= nb) finish_epoch(epoch, nb, loss.mean());
}

// A step boundary: a stop signal (snapshot, then stop: false), SIGUSR1 (snapshot), and
// DDP_TRAIN_FAULT's kill.
bool Run::at_step_boundary() {
  int stop = c_.stop_signal != nullptr ? c_.stop_signal->load() : 0;
  bool save_now = c_.save_request != nullptr && c_.save_request->exchange(false);
  if (engine_->shard_layout() != nullptr) agree_at_boundary(stop, save_now);
  if (stop != 0) {
    stop_on_signal(stop);
    return false;
  }
  if (save_now) save(pos_, "SIGUSR1");
  kill_if(FaultKind::kill, pos_.global_step, "");
  return true;
}

// DDP_TRAIN_FAULT's kills at one moment of step n: the rank's first process only.
void Run::kill_if(FaultKind kind, std::int64_t n, const char* where) {
  if (c_.restart_count == 0 && c_.heal == 0 && o_.fault.kills(kind, c_.rank, n)) {
    injected_kill(out(), c_.rank, n, where);
  }
}

// One optimizer step over micro-batches [mb, group_end): forward and backward of each, then the
// engine's step, where the all-reduce completes (the phases the agent is told), with
// DDP_TRAIN_FAULT's hang and slowness. Returns the summed loss, or nullopt when a peer failed
// mid-step because the job is being stopped (this rank then stops too).
std::optional<double> Run::step(const std::vector<std::uint32_t>& idx, std::int64_t mb,
                                std::int64_t group_end) {
  const auto B = static_cast<std::size_t>(o_.batch_size);
  const auto group = static_cast<std::size_t>(group_end - mb);
  const std::int64_t n = pos_.global_step;
  const bool faulty = o_.fault.rank == c_.rank;
  phase("compute", n);
  const auto computing = Clock::now();
  std::int64_t rows_in_step = 0;  // this rank's samples in the step
  try {
    for (; mb < group_end; ++mb) {
      const bool last = mb + 1 == group_end;  // its backward starts the all-reduce
      if (last && faulty && o_.fault.kind == FaultKind::hang && o_.fault.step == n &&
          c_.restart_count == 0 && c_.heal == 0) {
        injected_hang_before_allreduce(out(), c_.rank, n, c_.stop_signal);
      }
      const std::size_t rows = fill_batch(idx, static_cast<std::size_t>(mb) * B);
      const float scale = 1.0f / static_cast<float>(rows * group);
      const float* target = model_.spec().autoencoder ? xb_.data() : yb_.data();
      // Dropout masks: a function of (seed, rank, global step, micro-batch of the epoch), so
      // ranks and steps differ and a resumed run draws what a run never stopped would.
      const auto u64 = [](auto v) { return static_cast<std::uint64_t>(v); };
      const std::uint64_t by_rank = kernels::mix64(kernels::mix64(o_.seed) ^ u64(c_.rank));
      engine_->model().set_dropout_seed(kernels::mix64(kernels::mix64(by_rank ^ u64(n)) ^ u64(mb)));
      engine_->micro_batch(xb_.data(), lb_.data(), target, rows, scale, last);
      samples_ += static_cast<std::int64_t>(rows) * c_.world;
      rows_in_step += static_cast<std::int64_t>(rows);
    }
    if (faulty && o_.fault.kind == FaultKind::slow && n >= o_.fault.step) {
      if (n == o_.fault.step) out() << "ddp-train: DDP_TRAIN_FAULT: slow from step " << n << "\n";
      injected_slow_step(Clock::now() - computing, o_.fault.factor);
    }
    phase("allreduce", n, rows_in_step);
    kill_if(FaultKind::kill_allreduce, n, " during the all-reduce");
    const double loss = engine_->step();
    kill_if(FaultKind::kill_after, n, " after the all-reduce");
    return loss;
  } catch (const Error& e) {
    if (!peer_failed(e)) throw;
    // A peer failed mid-step: the parameters are still those of pos_, which every rank
    // reached; keep them so the restarted job loses no finished step.
    const bool sharded = engine_->shard_layout() != nullptr;
    // Healing in place, a stop's signal is given 100 ms: the survivors' stall is the point.
    if (being_stopped(c_.reconnect ? std::chrono::milliseconds(100) : std::chrono::seconds(1))) {
      // We are being stopped too (scancel signals every rank): the peer stopped one step
      // boundary earlier. Not a failure: the same snapshot, and the stop's exit code. (Sharded
      // ranks agree on their boundaries, so there the peer was not stopped by a signal and no
      // collective snapshot can be written without it.)
      stop_on_signal(c_.stop_signal->load(), !sharded);
      return std::nullopt;
    }
    if (c_.reconnect && (!sharded || copies_) && heal_from(e)) return std::nullopt;
    if (!sharded) {
      save(pos_, "a peer failed");
    } else if (leader()) {
      out() << "ddp-train: a peer failed; a sharded snapshot needs every rank, so the last "
               "committed one stands\n"
            << std::flush;
    }
    throw;
  }
}

// Copies the samples idx[first, first + batch) (fewer at the shard's end) into the batch
// buffers; returns the rows.
std::size_t Run::fill_batch(const std::vector<std::uint32_t>& idx, std::size_t first) {
  const std::size_t dim = train_.dim;
  const std::size_t out_dim = model_.spec().layers.back().out;
  const std::size_t rows = std::min(static_cast<std::size_t>(o_.batch_size), idx.size() - first);
  for (std::size_t r = 0; r < rows; ++r) {
    const std::uint32_t s = idx[first + r];
    std::copy_n(train_.x.data() + std::size_t{s} * dim, dim, xb_.data() + r * dim);
    if (train_.classes > 0) {
      lb_[r] = train_.labels[s];
    } else {
      std::copy_n(train_.y.data() + std::size_t{s} * out_dim, out_dim, yb_.data() + r * out_dim);
    }
  }
  return rows;
}

void Run::finish_epoch(std::int64_t epoch, std::int64_t nb, double mean) {
  epoch_losses_.push_back(mean);
  progress(epoch, nb, nb, mean, true);
  pos_ = {epoch + 1, 0, pos_.global_step};
  if (o_.save_every > 0 && (epoch + 1) % o_.save_every == 0) {
    save(pos_, "every SAVE_EVERY epochs");
  }
}

// A peer died mid-step (in-place recovery): the step is dropped on this rank (the engine
// zeroes its gradients; no optimizer step ran), the communicators are rebuilt with the dead
// rank's replacement, and every rank takes the state of the survivor holding the newest step.
// False when the engine cannot heal (the launcher then restarts the job).
// A failure during the heal itself (another death) withdraws the declaration first: this rank's
// exit then restarts the job, as torchrun's would.
bool Run::heal_from(const Error& e) {
  const auto t0 = Clock::now();
  std::cerr << "ddp-train rank " << c_.rank << ": " << e.what() << "; step " << pos_.global_step
            << " dropped, healing in place\n"
            << std::flush;
  phase("heal", pos_.global_step);
  kill_if(FaultKind::kill_heal, pos_.global_step, " entering the heal");
  PeerState got;
  try {
    if (!engine_->heal([&] { return c_.comm = c_.reconnect(); })) return false;
    got = copies_ ? heal_shards(*engine_, *c_.comm, *copies_, false)
                  : sync_from_peer(*engine_, *c_.comm, pos_);
  } catch (const Error& during) {
    if (c_.progress != nullptr) c_.progress->declare("recover=restart");
    const int stop = c_.stop_signal != nullptr ? c_.stop_signal->load() : 0;
    if (stop == 0) throw;
    std::cerr << "ddp-train rank " << c_.rank << ": the heal stops: " << during.what() << "\n"
              << std::flush;
    // The agent restarts the job instead (another death, no restarts left for a heal): the
    // snapshot at pos_ (the step was dropped, the state is pos_'s), then the stop's exit code.
    stop_on_signal(stop, !copies_);  // a sharded snapshot needs every rank's communicator
    return true;
  }
  // A survivor that went back to an older copy (--shard-copy-every K > 1) forgets the steps it
  // takes again.
  const std::int64_t undone = std::max<std::int64_t>(0, pos_.global_step - got.at.global_step);
  step_losses_.resize(step_losses_.size() -
                      std::min(step_losses_.size(), static_cast<std::size_t>(undone)));
  steps_this_run_ -= std::min(steps_this_run_, undone);
  pos_ = got.at;
  healed_ = true;
  std::cerr << "ddp-train rank " << c_.rank << ": healed in "
            << std::chrono::duration<double>(Clock::now() - t0).count()
            << " s: going on from global step " << pos_.global_step << " (rank " << got.from
            << "'s state)\n"
            << std::flush;
  return true;
}

// This process replaces a rank that died: the state comes from a survivor, not from disk.
void Run::join_as_replacement() {
  const PeerState got = copies_ ? heal_shards(*engine_, *c_.comm, *copies_, true)
                                : sync_from_peer(*engine_, *c_.comm, std::nullopt);
  start_ = got.at;
  resumed_ = true;
  std::cerr << "ddp-train rank " << c_.rank << ": replacement (heal " << c_.heal << "): rank "
            << got.from << "'s state at global step " << start_.global_step << ", no disk read\n"
            << std::flush;
}

// A stop signal arrived: the snapshot at pos_, then the run ends with 128 + the signal.
void Run::stop_on_signal(int signal, bool snapshot) {
  if (snapshot) save(pos_, "stop signal");
  exit_code_ = 128 + signal;
  stopping_ = true;
}

// Sharded ranks write snapshots together, so they must stop and save at the same step
// boundary: each boundary they share their stop signal and SIGUSR1 (one small all-gather),
// and every rank acts on the first rank's signal and on any rank's request.
void Run::agree_at_boundary(int& stop, bool& save_now) {
  if (c_.comm == nullptr || c_.world < 2) return;
  const int mine[2] = {stop, save_now ? 1 : 0};
  std::vector<int> all(2 * static_cast<std::size_t>(c_.world));
  c_.comm->all_gather(mine, all.data(), sizeof mine);
  for (std::size_t r = 0; r < all.size(); r += 2) {
    if (stop == 0) stop = all[r];
    save_now = save_now || all[r + 1] != 0;
  }
}

// Rank 0's summary line, the evaluation and the metrics file.
void Run::report(double secs, std::uint64_t checksum) {
  RunSummary s{to_string(o_.model),
               to_string(o_.dataset),
               c_.world,
               o_.batch_size,
               epoch_losses_,
               step_losses_,
               steps_this_run_,
               pos_.global_step,
               samples_,
               secs,
               last_loss_,
               checksum,
               to_string(engine_->sharding()),
               engine_->state_bytes_peak(),
               std::nullopt};
  if (resumed_) s.resumed_from = std::make_pair(start_.epoch, start_.step);
  s.optimizer = to_string(o_.optimizer.kind);
  s.lr = o_.optimizer.lr;
  s.lr_gamma = o_.lr_gamma;
  final_report(*engine_, s, test_, o_.eval, o_.metrics_json, out(),
               [&] { phase("eval", pos_.global_step); });
}

}  // namespace

int train(const TrainOptions& options, const TrainContext& ctx) {
  if (options.model == ModelKind::llama) return train_lm(options, ctx);
  Run run(options, ctx);
  return run.go();
}

}  // namespace ddp::train
