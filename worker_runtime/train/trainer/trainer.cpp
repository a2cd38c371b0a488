// ddp-train's training loop (see trainer.hpp, run.hpp and docs/ddp_train.md): setup, epochs,
// steps, progress and the report. A run's snapshots, stops and heals are in checkpoint.cpp.
#include "trainer.hpp"

#include "run.hpp"

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

}  // namespace

namespace detail {

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
  if (c_.connect_late) {  // joining a running job: connect now, the data is in
    engine_->heal([&] { return c_.comm = c_.connect_late(); });
    c_.rank = c_.comm->rank();
    c_.world = c_.comm->size();
  }
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
  if (c_.reconnect && c_.progress != nullptr) {
    c_.progress->declare(c_.regroups ? "recover=elastic" : "recover=in_place");
  }
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
  auto idx = shard_indices(train_.n, c_.world, c_.rank, o_.seed, static_cast<std::uint64_t>(epoch));
  auto nb = static_cast<std::int64_t>((idx.size() + B - 1) / B);
  const int world = c_.world;
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
      if (c_.world != world) {          // regrouped: this epoch's rest from the new world's shard
        return run_epoch(epoch);
      }
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
    if (c_.progress != nullptr) {  // on the next progress line, whose step is this one's end
      c_.progress->metric("loss", last_loss_);
      c_.progress->metric("lr", static_cast<double>(opt_.config().lr));
    }
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
    if (c_.regroup_pending && c_.regroup_pending()) {  // as a peer's death: before any work
      throw IoError("the agent regroups the job (a node left or joined)");
    }
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
    const bool heals = c_.reconnect && (!sharded || copies_);
    // Healing in place, a stop's signal is not waited for: the survivors' stall is the point,
    // and a stop that comes during the heal ends it there (heal_from), with the same snapshot.
    if (being_stopped(heals ? std::chrono::milliseconds(0) : std::chrono::seconds(1))) {
      // We are being stopped too (scancel signals every rank): the peer stopped one step
      // boundary earlier. Not a failure: the same snapshot, and the stop's exit code. (Sharded
      // ranks agree on their boundaries, so there the peer was not stopped by a signal and no
      // collective snapshot can be written without it.)
      stop_on_signal(c_.stop_signal->load(), !sharded);
      return std::nullopt;
    }
    if (heals && heal_from(e)) return std::nullopt;
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

}  // namespace detail

int train(const TrainOptions& options, const TrainContext& ctx) {
  if (options.model == ModelKind::llama) return train_lm(options, ctx);
  detail::Run run(options, ctx);
  return run.go();
}

}  // namespace ddp::train
