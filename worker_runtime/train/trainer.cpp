// ddp-train's training loop (see trainer.hpp and docs/ddp_train.md).
#include "trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>

#include "data.hpp"
#include "ddp/kernels/cpu_ref.hpp"
#include "ddp/proto/error.hpp"
#include "ddp/worker/comm.hpp"
#include "engine.hpp"
#include "model.hpp"
#include "sampler.hpp"
#include "snapshot.hpp"

namespace ddp::train {
namespace {

using Clock = std::chrono::steady_clock;

struct Fault {
  int rank = -1;
  std::int64_t step = -1;
};

Fault parse_fault(const std::string& text) {
  Fault f;
  if (text.empty()) return f;
  const auto colon = text.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    std::size_t used = 0;
    f.rank = std::stoi(text.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("rank");
    const std::string step = text.substr(colon + 1);
    f.step = std::stoll(step, &used);
    if (used != step.size()) throw std::invalid_argument("step");
  } catch (const std::exception&) {
    throw ConfigError("DDP_TRAIN_FAULT='" + text + "': expected RANK:STEP");
  }
  return f;
}

// Where the job stands between optimizer steps: what a snapshot records.
struct Position {
  std::int64_t epoch = 0;
  std::int64_t step = 0;  // next micro-batch in the epoch
  std::int64_t global_step = 0;
};

std::unique_ptr<Engine> make_engine(const TrainOptions& o, const TrainContext& c) {
  if (o.device == "cuda") {
    CudaEngineOptions co;
    co.device = c.cuda_device;
    co.max_rows = std::max<std::size_t>(static_cast<std::size_t>(o.batch_size), 1000);
    co.bf16 = o.precision == "bf16";
    co.bucket_cap_mb = o.bucket_cap_mb;
    return make_cuda_engine(model_spec(o.model), o.optimizer, c.device_comm, co);
  }
  return make_cpu_engine(model_spec(o.model), o.optimizer, c.comm, o.bucket_cap_mb);
}

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
  void load_data();
  void resume_or_init();
  void save(const Position& at, const char* why);
  double evaluate(nlohmann::json& metrics);
  void progress(std::int64_t epoch, std::int64_t mb, std::int64_t nb, double loss, bool end);
  bool being_stopped() const;

  const TrainOptions& o_;
  const TrainContext& c_;
  Dataset train_;
  Dataset test_;
  std::unique_ptr<Engine> engine_;
  Model& model_;  // the host copy (engine.hpp)
  Optimizer& opt_;
  Position start_;
  bool resumed_ = false;
  std::optional<Position> last_saved_;
  Clock::time_point t0_;
  std::int64_t samples_ = 0;  // this run, all ranks
};

void Run::load_data() {
  if (o_.dataset == "fashion-mnist") {
    train_ = load_fashion_mnist(o_.data_dir, true, o_.train_subset);
    if (o_.eval && leader()) test_ = load_fashion_mnist(o_.data_dir, false, 0);
  } else {
    train_ = make_synthetic(o_.train_subset > 0 ? std::min(o_.train_subset, o_.synthetic_size)
                                                : o_.synthetic_size);
  }
  const LayerSpec& first = model_.spec().layers.front();
  if (first.in != train_.dim) {
    throw ConfigError("--model " + o_.model + " takes " + std::to_string(first.in) +
                      " inputs; --dataset " + o_.dataset + " has " + std::to_string(train_.dim));
  }
}

void Run::resume_or_init() {
  model_.init(o_.seed);
  // Rank 0 reads the snapshot and sends it to every rank, so nodes need no shared folder.
  std::int64_t head[5] = {0, 0, 0, 0, 0};  // has, epoch, step, global_step, adam_t
  if (leader() && !o_.snapshot.empty()) {
    if (auto s = read_snapshot_file(o_.snapshot)) {
      const auto& h = s->header;
      if (h.model != o_.model || s->params.size() != model_.param_count()) {
        throw ConfigError("snapshot " + o_.snapshot + " holds model '" + h.model + "' with " +
                          std::to_string(s->params.size()) + " parameters; this run trains '" +
                          o_.model + "' with " + std::to_string(model_.param_count()) +
                          " (remove the file or pass another --snapshot)");
      }
      if (h.optimizer != opt_.config().kind || s->opt_state.size() != opt_.state().size()) {
        throw ConfigError("snapshot " + o_.snapshot + " was written with --optimizer " +
                          h.optimizer + "; this run uses " + opt_.config().kind);
      }
      model_.params() = s->params;
      opt_.state() = s->opt_state;
      head[0] = 1;
      head[1] = h.epoch;
      head[2] = h.step;
      head[3] = h.global_step;
      head[4] = h.adam_t;
    }
  }
  if (c_.comm != nullptr) {
    c_.comm->broadcast(head, sizeof head, 0);
    c_.comm->broadcast(model_.params().data(), model_.param_count() * sizeof(float), 0);
    if (head[0] != 0 && !opt_.state().empty()) {
      c_.comm->broadcast(opt_.state().data(), opt_.state().size() * sizeof(float), 0);
    }
  }
  engine_->upload();
  if (head[0] != 0) {
    resumed_ = true;
    start_ = {head[1], head[2], head[3]};
    opt_.set_steps(head[4]);
    last_saved_ = start_;
    if (leader()) {
      out() << "ddp-train: resuming from snapshot " << o_.snapshot << ": epoch " << start_.epoch
            << " step " << start_.step << " (global step " << start_.global_step << ")\n"
            << std::flush;
    }
  }
}

void Run::save(const Position& at, const char* why) {
  if (!leader() || o_.snapshot.empty()) return;
  if (last_saved_ && last_saved_->global_step == at.global_step && last_saved_->epoch == at.epoch &&
      last_saved_->step == at.step) {
    return;
  }
  engine_->download();
  Snapshot s;
  s.header.model = o_.model;
  s.header.optimizer = opt_.config().kind;
  s.header.epoch = at.epoch;
  s.header.step = at.step;
  s.header.global_step = at.global_step;
  s.header.adam_t = opt_.steps();
  s.header.seed = o_.seed;
  s.header.lr = opt_.config().lr;
  s.header.world_size = c_.world;
  s.header.batch_size = o_.batch_size;
  s.params = model_.params();
  s.opt_state = opt_.state();
  write_snapshot_file(o_.snapshot, s);
  last_saved_ = at;
  out() << "ddp-train: snapshot " << o_.snapshot << " written (" << why << "): epoch " << at.epoch
        << " step " << at.step << " global step " << at.global_step << "\n"
        << std::flush;
}

// After a peer vanished mid-step: whether this rank is being stopped too. scancel signals the
// nodes one after another, so a peer may stop at a step boundary before our own signal has
// arrived; it is given a second to arrive before the peer's exit counts as a failure.
bool Run::being_stopped() const {
  if (c_.stop_signal == nullptr) return false;
  const auto until = Clock::now() + std::chrono::seconds(1);
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
  std::ostringstream line;
  line << "epoch " << epoch + 1 << "/" << o_.total_epochs << " step " << mb << "/" << nb << " loss "
       << std::fixed << std::setprecision(4) << loss << " samples/s " << std::setprecision(0)
       << rate;
  if (c_.tty) {
    constexpr int kWidth = 30;
    const auto filled = nb > 0 ? static_cast<int>(kWidth * mb / nb) : kWidth;
    out() << "\r[" << std::string(static_cast<std::size_t>(filled), '#')
          << std::string(static_cast<std::size_t>(kWidth - filled), '.') << "] " << line.str()
          << (end ? "\n" : "") << std::flush;
  } else {
    out() << line.str() << "\n" << std::flush;
  }
}

double Run::evaluate(nlohmann::json& metrics) {
  if (test_.n == 0) return 0.0;
  constexpr std::size_t kChunk = 1000;
  std::size_t correct = 0;
  double sq = 0.0;
  std::vector<float> scratch;
  for (std::size_t at = 0; at < test_.n; at += kChunk) {
    const std::size_t rows = std::min(kChunk, test_.n - at);
    const float* x = test_.x.data() + at * test_.dim;
    const float* y = engine_->predict(x, rows);
    const std::size_t out_dim = model_.spec().layers.back().out;
    if (model_.spec().loss == Loss::cross_entropy) {
      correct += kernels::cpu::count_correct(y, test_.labels.data() + at, rows, out_dim);
    } else {
      scratch.resize(rows * out_dim);
      sq += kernels::cpu::mse(y, x, scratch.data(), rows * out_dim, 1.0f);
    }
  }
  if (model_.spec().loss == Loss::cross_entropy) {
    const double acc = static_cast<double>(correct) / static_cast<double>(test_.n);
    metrics["test_accuracy"] = acc;
    out() << "test accuracy: " << std::fixed << std::setprecision(4) << acc << " (" << correct
          << "/" << test_.n << ")\n";
    return acc;
  }
  const double mse = sq / static_cast<double>(test_.n * test_.dim);
  metrics["test_mse"] = mse;
  out() << "test mse: " << std::fixed << std::setprecision(6) << mse << "\n";
  return mse;
}

int Run::go() {
  load_data();
  resume_or_init();
  const Fault fault = parse_fault(o_.fault);
  if (leader()) {
    out() << "ddp-train: " << o_.model << " (" << model_.param_count() << " parameters) on "
          << o_.dataset << " (" << train_.n << " samples), world size " << c_.world << ", batch "
          << o_.batch_size << " per rank, " << opt_.config().kind << " lr " << opt_.config().lr
          << ", " << engine_->bucket_count() << " gradient bucket(s), backend "
          << (c_.device_comm != nullptr ? c_.device_comm->backend()
              : c_.comm != nullptr      ? c_.comm->backend()
                                        : "none")
          << ", device " << engine_->device()
          << (o_.device == "cuda" ? ", precision " + o_.precision : std::string()) << "\n"
          << std::flush;
  }

  const auto B = static_cast<std::size_t>(o_.batch_size);
  const auto K = static_cast<std::size_t>(o_.grad_accum);
  const std::size_t dim = train_.dim;
  const std::size_t out_dim = model_.spec().layers.back().out;
  std::vector<float> xb(B * dim);
  std::vector<std::uint8_t> lb(B);
  std::vector<float> yb(B * out_dim);
  std::vector<double> epoch_losses;
  double last_loss = 0.0;
  std::int64_t steps_this_run = 0;
  Position pos = start_;
  bool stop_early = false;
  int exit_code = 0;
  t0_ = Clock::now();
  const auto rows_total = [&](std::size_t rows) {
    return static_cast<std::int64_t>(rows) * c_.world;
  };

  for (std::int64_t epoch = pos.epoch; epoch < o_.total_epochs && !stop_early; ++epoch) {
    const auto idx =
        shard_indices(train_.n, c_.world, c_.rank, o_.seed, static_cast<std::uint64_t>(epoch));
    const auto nb = static_cast<std::int64_t>((idx.size() + B - 1) / B);
    const std::int64_t log_every =
        o_.log_every > 0 ? o_.log_every : std::max<std::int64_t>(1, nb / 10);
    double loss_sum = 0.0;
    std::int64_t loss_n = 0;
    std::int64_t mb = epoch == start_.epoch ? pos.step : 0;
    pos = {epoch, mb, pos.global_step};
    while (mb < nb) {
      // A step boundary: signals, fault injection, limits.
      if (c_.stop_signal != nullptr && c_.stop_signal->load() != 0) {
        save(pos, "stop signal");
        exit_code = 128 + c_.stop_signal->load();
        stop_early = true;
        break;
      }
      if (c_.save_request != nullptr && c_.save_request->exchange(false)) save(pos, "SIGUSR1");
      if (c_.restart_count == 0 && fault.rank == c_.rank && fault.step == pos.global_step) {
        out() << "ddp-train: DDP_TRAIN_FAULT: rank " << c_.rank << " kills itself at step "
              << pos.global_step << "\n"
              << std::flush;
        std::raise(SIGKILL);
      }
      const std::int64_t group_end = std::min<std::int64_t>(nb, mb + static_cast<std::int64_t>(K));
      const auto group = static_cast<std::size_t>(group_end - mb);
      double step_loss = 0.0;
      try {
        for (; mb < group_end; ++mb) {
          const std::size_t first = static_cast<std::size_t>(mb) * B;
          const std::size_t rows = std::min(B, idx.size() - first);
          for (std::size_t r = 0; r < rows; ++r) {
            const std::uint32_t s = idx[first + r];
            std::copy_n(train_.x.data() + std::size_t{s} * dim, dim, xb.data() + r * dim);
            if (train_.classes > 0) {
              lb[r] = train_.labels[s];
            } else {
              std::copy_n(train_.y.data() + std::size_t{s} * out_dim, out_dim,
                          yb.data() + r * out_dim);
            }
          }
          const float scale = 1.0f / static_cast<float>(rows * group);
          const float* target = model_.spec().autoencoder ? xb.data() : yb.data();
          engine_->micro_batch(xb.data(), lb.data(), target, rows, scale, mb + 1 == group_end);
          samples_ += rows_total(rows);
        }
        step_loss = engine_->step();
      } catch (const IoError&) {
        // A peer failed mid-step: the parameters are still those of `pos`, which every rank
        // reached; keep them so the restarted job loses no finished step.
        if (being_stopped()) {
          // We are being stopped too (scancel signals every rank): the peer stopped one step
          // boundary earlier. Not a failure: the same snapshot, and the stop's exit code.
          save(pos, "stop signal");
          exit_code = 128 + c_.stop_signal->load();
          stop_early = true;
          break;
        }
        save(pos, "a peer failed");
        throw;
      }
      ++steps_this_run;
      pos = {epoch, mb, pos.global_step + 1};
      last_loss = step_loss / static_cast<double>(group);
      loss_sum += last_loss;
      ++loss_n;
      if (!std::isfinite(last_loss)) {
        throw ConfigError("the loss is " + std::to_string(last_loss) + " at step " +
                          std::to_string(pos.global_step) + " (a learning rate too high?)");
      }
      if (mb < nb && (pos.global_step % log_every == 0)) progress(epoch, mb, nb, last_loss, false);
      if (o_.max_steps > 0 && steps_this_run >= o_.max_steps) {
        stop_early = true;
        break;
      }
    }
    if (exit_code != 0) break;
    if (mb >= nb) {
      const double mean = loss_n > 0 ? loss_sum / static_cast<double>(loss_n) : 0.0;
      epoch_losses.push_back(mean);
      progress(epoch, nb, nb, mean, true);
      pos = {epoch + 1, 0, pos.global_step};
      if (o_.save_every > 0 && (epoch + 1) % o_.save_every == 0)
        save(pos, "every SAVE_EVERY epochs");
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0_).count();
  if (exit_code != 0) return exit_code;
  save(pos, "end of run");

  if (leader()) {
    engine_->download();
    nlohmann::json m;
    m["model"] = o_.model;
    m["dataset"] = o_.dataset;
    m["world_size"] = c_.world;
    m["batch_size"] = o_.batch_size;
    m["epochs_run"] = epoch_losses.size();
    m["epoch_losses"] = epoch_losses;
    m["steps"] = steps_this_run;
    m["global_step"] = pos.global_step;
    m["train_seconds"] = secs;
    m["samples_per_sec"] = secs > 0 ? static_cast<double>(samples_) / secs : 0.0;
    m["final_loss"] = last_loss;
    std::ostringstream sum;
    sum << std::hex << std::setw(16) << std::setfill('0')
        << fnv1a64(model_.params().data(), model_.param_count() * sizeof(float));
    m["param_checksum"] = sum.str();
    m["resumed_from"] = resumed_ ? nlohmann::json{{"epoch", start_.epoch}, {"step", start_.step}}
                                 : nlohmann::json(nullptr);
    out() << "ddp-train: " << steps_this_run << " steps in " << std::fixed << std::setprecision(2)
          << secs << " s, " << std::setprecision(0) << m["samples_per_sec"].get<double>()
          << " samples/s, final loss " << std::setprecision(4) << last_loss << "\n";
    if (o_.eval) evaluate(m);
    out() << std::flush;
    if (!o_.metrics_json.empty()) {
      std::ofstream f(o_.metrics_json);
      f << m.dump(2) << "\n";
      if (!f) throw IoError("--metrics-json " + o_.metrics_json + ": cannot write");
    }
  }
  return 0;
}

}  // namespace

void validate(TrainOptions& o) {
  if (o.total_epochs < 0) throw ConfigError("TOTAL_EPOCHS must be >= 0");
  if (o.save_every < 0) throw ConfigError("SAVE_EVERY must be >= 0");
  if (o.batch_size < 1) throw ConfigError("--batch-size must be >= 1");
  if (o.grad_accum < 1) throw ConfigError("--grad-accum must be >= 1");
  if (!(o.optimizer.lr > 0.0f) || !std::isfinite(o.optimizer.lr)) {
    throw ConfigError("--lr must be a positive number");
  }
  if (o.optimizer.momentum < 0.0f || o.optimizer.momentum >= 1.0f) {
    throw ConfigError("--momentum must be in [0, 1)");
  }
  if (!(o.bucket_cap_mb > 0.0) || o.bucket_cap_mb > 4096) {
    throw ConfigError("--bucket-cap-mb must be in (0, 4096]");
  }
  if (o.max_steps < 0) throw ConfigError("--max-steps must be >= 0");
  if (o.device != "cpu" && o.device != "cuda") {
    throw ConfigError("--device '" + o.device + "': expected cpu, cuda or auto");
  }
  if (o.precision != "fp32" && o.precision != "bf16") {
    throw ConfigError("--precision '" + o.precision + "': expected fp32 or bf16");
  }
  if (o.precision == "bf16" && o.device != "cuda") {
    throw ConfigError("--precision bf16 needs --device cuda (the CPU path computes in fp32)");
  }
  if (o.dataset != "fashion-mnist" && o.dataset != "synthetic") {
    throw ConfigError("--dataset '" + o.dataset + "': expected fashion-mnist or synthetic");
  }
  if (o.model.empty()) o.model = o.dataset == "synthetic" ? "linear" : "mlp";
  (void)model_spec(o.model);  // names the choices when unknown
  Optimizer check(o.optimizer, 0);
  if (o.synthetic_size < 1) throw ConfigError("--synthetic-size must be >= 1");
  (void)parse_fault(o.fault);
}

int train(const TrainOptions& options, const TrainContext& ctx) {
  Run run(options, ctx);
  return run.go();
}

}  // namespace ddp::train
