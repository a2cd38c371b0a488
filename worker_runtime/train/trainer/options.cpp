// ddp-train's option parser (see options.hpp): each choice's names in one table, the words
// turned into enums once, and the checks that name the option at fault; DDP_TRAIN_FAULT's
// parser and its injected hang and slowness.
#include "options.hpp"

#include <cerrno>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "ddp/proto/error.hpp"
#include "ddp/proto/number.hpp"
#include "choice_names.hpp"

namespace ddp::train {
namespace {

using choice_names::find;
using choice_names::Name;
using choice_names::name_of;
using choice_names::parse;

constexpr Name<Device> kDevices[] = {{Device::cpu, "cpu"}, {Device::cuda, "cuda"}};
constexpr Name<Backend> kBackends[] = {{Backend::gloo, "gloo"}, {Backend::nccl, "nccl"}};
constexpr Name<Sharding> kShardings[] = {{Sharding::none, "none"},
                                         {Sharding::optimizer, "optimizer"},
                                         {Sharding::gradients, "gradients"},
                                         {Sharding::full, "full"}};
constexpr Name<Precision> kPrecisions[] = {{Precision::fp32, "fp32"}, {Precision::bf16, "bf16"}};
constexpr Name<DatasetKind> kDatasets[] = {{DatasetKind::fashion_mnist, "fashion-mnist"},
                                           {DatasetKind::synthetic, "synthetic"}};
constexpr Name<OptimizerKind> kOptimizers[] = {{OptimizerKind::sgd, "sgd"},
                                               {OptimizerKind::adam, "adam"},
                                               {OptimizerKind::adadelta, "adadelta"},
                                               {OptimizerKind::adamw, "adamw"}};

}  // namespace

std::string to_string(Device d) { return name_of(kDevices, d); }
std::string to_string(Backend b) { return name_of(kBackends, b); }
std::string to_string(Precision p) { return name_of(kPrecisions, p); }
std::string to_string(Sharding s) { return name_of(kShardings, s); }
std::string to_string(DatasetKind d) { return name_of(kDatasets, d); }
std::string to_string(OptimizerKind k) { return name_of(kOptimizers, k); }

std::optional<OptimizerKind> optimizer_named(std::string_view name) {
  return find(kOptimizers, name);
}

Fault parse_fault(const std::string& text) {
  Fault f;
  if (text.empty()) return f;
  const auto c1 = text.find(':');
  const auto c2 = c1 == std::string::npos ? c1 : text.find(':', c1 + 1);
  try {
    if (c1 == std::string::npos) throw ConfigError("no colon");
    f.rank = static_cast<int>(parse_int(text.substr(0, c1), "rank", 0, 1 << 24));
    f.step = parse_int(text.substr(c1 + 1, c2 == std::string::npos ? c2 : c2 - c1 - 1), "step", 0,
                       std::int64_t{1} << 62);
    if (c2 != std::string::npos) {
      const std::string kind = text.substr(c2 + 1);
      constexpr std::string_view kSlow = "slow=";
      if (kind == "kill") {
        f.kind = FaultKind::kill;
      } else if (kind == "kill@allreduce") {
        f.kind = FaultKind::kill_allreduce;
      } else if (kind == "kill@after") {
        f.kind = FaultKind::kill_after;
      } else if (kind == "kill@snapshot") {
        f.kind = FaultKind::kill_snapshot;
      } else if (kind == "kill@heal") {
        f.kind = FaultKind::kill_heal;
      } else if (kind == "hang") {
        f.kind = FaultKind::hang;
      } else if (kind.starts_with(kSlow)) {
        f.kind = FaultKind::slow;
        const char* first = kind.c_str() + kSlow.size();
        char* last = nullptr;
        errno = 0;
        f.factor = std::strtod(first, &last);
        if (*first < '0' || *first > '9' || *last != '\0' || errno != 0 || !(f.factor > 1.0) ||
            f.factor > 1000.0) {
          throw ConfigError("bad factor");
        }
      } else {
        throw ConfigError("bad kind");
      }
    }
  } catch (const ConfigError&) {
    throw ConfigError("DDP_TRAIN_FAULT='" + text +
                      "': expected RANK:STEP (kill), RANK:STEP:KIND with KIND kill, "
                      "kill@allreduce, kill@after, kill@snapshot, kill@heal or hang, or "
                      "RANK:STEP:slow=F with F in (1, 1000]");
  }
  return f;
}

std::vector<Fault> parse_faults(const std::string& text) {
  std::vector<Fault> out;
  if (text.empty()) return out;
  std::size_t from = 0;
  for (;;) {
    const std::size_t comma = text.find(',', from);
    if (out.size() == kMaxFaults) {
      throw ConfigError("DDP_TRAIN_FAULT: more than " + std::to_string(kMaxFaults) + " faults");
    }
    const std::string one = text.substr(from, comma == std::string::npos ? comma : comma - from);
    if (one.empty()) throw ConfigError("DDP_TRAIN_FAULT='" + text + "': an empty fault");
    out.push_back(parse_fault(one));
    if (comma == std::string::npos) return out;
    from = comma + 1;
  }
}

Fault fault_for(const std::vector<Fault>& faults, int rank) {
  for (const Fault& f : faults) {
    if (f.rank == rank) return f;
  }
  return Fault{};
}

void injected_kill(std::ostream& out, int rank, std::int64_t step, const std::string& where) {
  out << "ddp-train: DDP_TRAIN_FAULT: rank " << rank << " kills itself" << where << " at step "
      << step << "\n"
      << std::flush;
  std::raise(SIGKILL);
  std::abort();  // not reached
}

void injected_hang_before_allreduce(std::ostream& out, int rank, std::int64_t step,
                                    const std::atomic<int>* stop_signal) {
  out << "ddp-train: DDP_TRAIN_FAULT: rank " << rank
      << " hangs before the gradient all-reduce of step " << step << "\n"
      << std::flush;
  for (;;) {
    const int sig = stop_signal != nullptr ? stop_signal->load() : 0;
    if (sig != 0) {
      std::fflush(nullptr);
      std::_Exit(128 + sig);  // no snapshot, no destructors: the step never finished
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void injected_slow_step(std::chrono::steady_clock::duration compute, double factor) {
  std::this_thread::sleep_for(
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(compute * (factor - 1.0)));
}

void apply_choices(const ChoiceWords& w, const std::function<bool()>& cuda_visible,
                   TrainOptions& o) {
  if (w.device == "auto") {
    o.device = cuda_visible() ? Device::cuda : Device::cpu;
  } else {
    o.device = parse(kDevices, w.device, "--device", "cpu, cuda or auto");
  }
  if (w.backend == "auto") {
    o.backend = o.device == Device::cuda ? Backend::nccl : Backend::gloo;
  } else {
    o.backend = parse(kBackends, w.backend, "--backend", "auto, gloo or nccl");
  }
  if ((o.backend == Backend::nccl) != (o.device == Device::cuda)) {
    throw ConfigError("--backend " + to_string(o.backend) + " with --device " +
                      to_string(o.device) +
                      ": gradients on the GPU go through nccl, on the CPU through gloo");
  }
  o.precision = parse(kPrecisions, w.precision, "--precision", "fp32 or bf16");
  o.sharding = parse(kShardings, w.sharding, "--sharding", "none, optimizer, gradients or full");
  o.dataset = parse(kDatasets, w.dataset, "--dataset", "fashion-mnist or synthetic");
  if (w.model.empty()) {
    o.model = o.dataset == DatasetKind::synthetic ? ModelKind::linear : ModelKind::mlp;
  } else {
    o.model = parse_model(w.model);
  }
  if (o.model == ModelKind::llama && w.device == "auto") o.device = Device::cpu;
  if (o.model == ModelKind::llama && w.backend == "auto") o.backend = Backend::gloo;
  // The model's recipe, unless the command line says otherwise; its rates go with its optimizer.
  const Recipe recipe = recipe_for(o.model);
  o.optimizer.kind = w.optimizer.empty() ? recipe.optimizer
                                         : parse(kOptimizers, w.optimizer, "--optimizer",
                                                 "sgd, adam, adadelta or adamw");
  const bool recipes_own = o.optimizer.kind == recipe.optimizer;
  if (!w.lr_given) o.optimizer.lr = recipes_own ? recipe.lr : default_lr(o.optimizer.kind);
  if (!w.lr_gamma_given && recipes_own) o.lr_gamma = recipe.lr_gamma;
}

Recipe recipe_for(ModelKind m) {
  switch (m) {
    case ModelKind::convnet: return {OptimizerKind::adadelta, 1.0f, 0.7f};
    case ModelKind::llama: return {OptimizerKind::adamw, 3e-3f, 1.0f};
    case ModelKind::mlp:
    case ModelKind::autoencoder: return {OptimizerKind::adam, 1e-3f, 1.0f};
    case ModelKind::linear: return {OptimizerKind::sgd, 1e-3f, 1.0f};
  }
  return {OptimizerKind::sgd, 1e-3f, 1.0f};
}

float default_lr(OptimizerKind k) { return k == OptimizerKind::adadelta ? 1.0f : 1e-3f; }

std::string recipes_text() {
  std::string out;
  for (ModelKind m : {ModelKind::mlp, ModelKind::autoencoder, ModelKind::linear, ModelKind::convnet,
                      ModelKind::llama}) {
    const Recipe r = recipe_for(m);
    std::ostringstream line;
    line << to_string(m) << ": " << to_string(r.optimizer) << " lr " << r.lr;
    if (r.lr_gamma != 1.0f) line << ", lr-gamma " << r.lr_gamma;
    out += (out.empty() ? "" : "; ") + line.str();
  }
  return out;
}

void validate(const TrainOptions& o) {
  if (o.total_epochs < 0) throw ConfigError("TOTAL_EPOCHS must be >= 0");
  if (o.save_every < 0) throw ConfigError("SAVE_EVERY must be >= 0");
  if (o.batch_size < 1) throw ConfigError("--batch-size must be >= 1");
  if (o.grad_accum < 1) throw ConfigError("--grad-accum must be >= 1");
  if (!(o.optimizer.lr > 0.0f) || !std::isfinite(o.optimizer.lr)) {
    throw ConfigError("--lr must be a positive number");
  }
  if (!(o.lr_gamma > 0.0f) || o.lr_gamma > 1.0f) {
    throw ConfigError("--lr-gamma must be in (0, 1] (1: a constant learning rate)");
  }
  if (o.optimizer.momentum < 0.0f || o.optimizer.momentum >= 1.0f) {
    throw ConfigError("--momentum must be in [0, 1)");
  }
  if (!(o.bucket_cap_mb > 0.0) || o.bucket_cap_mb > 4096) {
    throw ConfigError("--bucket-cap-mb must be in (0, 4096]");
  }
  if (o.max_steps < 0) throw ConfigError("--max-steps must be >= 0");
  if (o.shard_copy_every < 0 || o.shard_copy_every > 1000000) {
    throw ConfigError("--shard-copy-every must be in [0, 1000000], not " +
                      std::to_string(o.shard_copy_every));
  }
  if (o.precision == Precision::bf16 && o.device != Device::cuda) {
    throw ConfigError("--precision bf16 needs --device cuda (the CPU path computes in fp32)");
  }
  if (o.synthetic_size < 1) throw ConfigError("--synthetic-size must be >= 1");
  if ((o.hidden != 0 || o.layers != 0) && o.model != ModelKind::mlp) {
    throw ConfigError("--hidden and --layers shape the mlp only (--model " + to_string(o.model) +
                      ")");
  }
  if (o.model == ModelKind::llama) {
    if (o.device != Device::cpu) {
      throw ConfigError(
          "--model llama runs on --device cpu (its CUDA kernels exist, the GPU "
          "engine for it does not yet)");
    }
    if (o.grad_accum != 1) throw ConfigError("--grad-accum is not supported with --model llama");
    if (!(o.val_fraction > 0.0) || o.val_fraction > 0.5) {
      throw ConfigError("--val-fraction must be in (0, 0.5]");
    }
    if (o.eval_seqs > 1000000) throw ConfigError("--eval-seqs: at most 1000000");
    if (o.epoch_steps < 0) throw ConfigError("--epoch-steps must be >= 0");
    // Activations are kept per token for backward: bound the tokens a rank holds at once.
    constexpr std::size_t kMaxTokens = std::size_t{1} << 20;
    if (static_cast<std::size_t>(o.batch_size) * o.lm.seq_len > kMaxTokens) {
      throw ConfigError("--batch-size " + std::to_string(o.batch_size) + " x --seq-len " +
                        std::to_string(o.lm.seq_len) + ": more than " + std::to_string(kMaxTokens) +
                        " tokens per rank and step");
    }
    validate(o.lm, 1);
  } else if (!o.mesh.empty()) {
    throw ConfigError("--mesh needs --model llama (the other models are data parallel only)");
  }
  if (o.optimizer.weight_decay < 0.0f || o.optimizer.weight_decay >= 1.0f) {
    throw ConfigError("--weight-decay must be in [0, 1)");
  }
  if (o.model == ModelKind::convnet && o.dataset != DatasetKind::fashion_mnist) {
    throw ConfigError("--model convnet with --dataset " + to_string(o.dataset) +
                      ": the convnet reads 28x28 images (--dataset fashion-mnist)");
  }
  if (o.hidden > kMaxHidden) {
    throw ConfigError("--hidden " + std::to_string(o.hidden) + ": at most " +
                      std::to_string(kMaxHidden));
  }
  if (o.layers < 0 || o.layers > kMaxLayers) {
    throw ConfigError("--layers " + std::to_string(o.layers) + ": from 1 to " +
                      std::to_string(kMaxLayers));
  }
  if (o.model == ModelKind::mlp && (o.hidden != 0 || o.layers != 0)) {
    const std::size_t n = param_count(model_spec(o.model, o.hidden, o.layers));
    if (n > kMaxParams) {
      throw ConfigError("--hidden " + std::to_string(o.hidden) + " --layers " +
                        std::to_string(o.layers) + ": " + std::to_string(n) +
                        " parameters, above the " + std::to_string(kMaxParams) +
                        " ddp-train takes");
    }
  }
}

}  // namespace ddp::train
