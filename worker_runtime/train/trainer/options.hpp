// ddp-train's options, parsed once: main.cpp reads the command line (CLI11) into ChoiceWords and
// the numbers, apply_choices() turns the words into enums, validate() checks the rest. Past this
// file nothing compares option strings; to_string() names a choice for messages, the metrics
// file and snapshots. DDP_TRAIN_FAULT ("RANK:STEP[:hang|:slow=F]") is parsed here too.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lm_spec.hpp"
#include "model.hpp"
#include "optimizer.hpp"
#include "shard_layout.hpp"

namespace ddp::train {

enum class Device { cpu, cuda };
enum class Backend { gloo, nccl };  // host collectives for cpu, NCCL for cuda
enum class Precision { fp32, bf16 };
enum class DatasetKind { fashion_mnist, synthetic };

std::string to_string(Device d);
std::string to_string(Backend b);
std::string to_string(Precision p);
std::string to_string(DatasetKind d);
std::string to_string(OptimizerKind k);
std::string to_string(Sharding s);

// A name's choice, or nullopt (no throw): for names read back from a snapshot.
std::optional<OptimizerKind> optimizer_named(std::string_view name);

// DDP_TRAIN_FAULT, for tests: what rank `rank` does at global step `step` (steps count from 0,
// as the snapshot's global_step). rank -1: no fault. Several faults, one per rank, are separated
// by commas ("1:20:kill,2:20:kill"); a rank takes the first that names it (fault_for).
//   kill  ("RANK:STEP" or "RANK:STEP:kill"): SIGKILLs itself before the step; first attempt only.
//   The kills at other moments of step STEP (first attempt, the first process of the rank only):
//     "kill@allreduce": after the last micro-batch's backward started the gradient all-reduce,
//                       before the rank waits for it (the all-reduce is in flight);
//     "kill@after":     after the all-reduce and this rank's optimizer step, before the boundary;
//     "kill@snapshot":  midway through writing the snapshot at global step STEP (rank 0 writes
//                       replicated snapshots; every rank its shard);
//     "kill@heal":      on entering an in-place heal at step STEP (a peer died: a second death).
//   hang  ("RANK:STEP:hang"): sleeps forever in injected_hang_before_allreduce() (below)
//         before the step's last micro-batch, whose backward starts the gradient all-reduce, so
//         the other ranks wait inside it; first attempt only, so a restart recovers.
//   slow  ("RANK:STEP:slow=F", F in (1, 1000]): from that step on, every attempt, the rank
//         sleeps (F - 1) x its own measured compute time per step, so it computes F x slower.
enum class FaultKind { kill, kill_allreduce, kill_after, kill_snapshot, kill_heal, hang, slow };
struct Fault {
  int rank = -1;
  std::int64_t step = -1;
  FaultKind kind = FaultKind::kill;
  double factor = 1.0;  // slow's F
  // Whether this fault is a kill of `kind` at `step` for `rank`.
  bool kills(FaultKind k, int r, std::int64_t s) const {
    return kind == k && rank == r && step == s;
  }
};
// "" is no fault; else one of the forms above or ConfigError naming DDP_TRAIN_FAULT.
Fault parse_fault(const std::string& text);
// A comma-separated list of faults (at most kMaxFaults), each as parse_fault reads it.
inline constexpr std::size_t kMaxFaults = 64;
std::vector<Fault> parse_faults(const std::string& text);
// The first fault naming `rank`, else no fault.
Fault fault_for(const std::vector<Fault>& faults, int rank);
// Says "ddp-train: DDP_TRAIN_FAULT: rank R kills itself <where> at step S" on `out`, then
// SIGKILLs the process.
[[noreturn]] void injected_kill(std::ostream& out, int rank, std::int64_t step,
                                const std::string& where);

// DDP_TRAIN_FAULT's hang and slowness, as functions of their own (never inlined, external
// linkage) so that a stack taken from the rank (eu-stack, gdb) names them.
// Says so on `out`, then sleeps until a stop signal (SIGTERM/SIGINT) arrives and ends the
// process at once with 128 + the signal, as a stuck process taking the signal's default action.
[[noreturn, gnu::noinline]] void injected_hang_before_allreduce(
    std::ostream& out, int rank, std::int64_t step, const std::atomic<int>* stop_signal);
// Sleeps (factor - 1) x `compute`: a slow rank's added time.
[[gnu::noinline]] void injected_slow_step(std::chrono::steady_clock::duration compute,
                                          double factor);

struct TrainOptions {
  int total_epochs = 0;
  int save_every = 0;
  int batch_size = 32;
  ModelKind model = ModelKind::mlp;  // --model; without it, linear for the synthetic dataset
  // --hidden / --layers: the MLP's width and number of hidden layers (0: its default shape,
  // 784-256-128-10), to make a model as large as a memory test needs.
  std::size_t hidden = 0;
  int layers = 0;
  DatasetKind dataset = DatasetKind::fashion_mnist;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::size_t train_subset = 0;
  std::size_t synthetic_size = 2048;
  OptimizerConfig optimizer;
  // --lr-gamma: StepLR(step_size=1, gamma): epoch e (0-based, from the job's start, so a resumed
  // job continues the schedule) runs with --lr x gamma^e. 1: a constant rate.
  float lr_gamma = 1.0f;
  std::uint64_t seed = 0;
  int grad_accum = 1;
  std::string snapshot = "snapshot.ddp";
  std::string metrics_json;
  double bucket_cap_mb = 25.0;
  std::int64_t max_steps = 0;
  int log_every = 0;
  bool eval = true;
  Fault fault;  // DDP_TRAIN_FAULT
  Device device = Device::cpu;
  Backend backend = Backend::gloo;
  Precision precision = Precision::fp32;  // bf16: cuda only
  Sharding sharding = Sharding::none;     // --sharding
  bool in_place_recovery = false;         // --recovery in-place (docs/ddp_train.md)
  // --shard-copy-every K: sharded engines healing in place keep each rank's shard on its
  // successor, refreshed every K steps (0: no copies, a death restarts the job).
  std::int64_t shard_copy_every = 1;
  bool prefetch = true;  // --no-prefetch turns full sharding's prefetch off
  // --model llama (issue 20): the transformer's sizes, the mesh, the text.
  LmConfig lm;
  std::string mesh;  // --mesh "dp=D,tp=T" ("": dp = world)
  std::string text = "/usr/share/games/fortunes";
  double val_fraction = 0.1;
  std::size_t eval_seqs = 64;    // validation windows per evaluation
  std::int64_t epoch_steps = 0;  // 0: one pass over the training text's tokens
};

// A model's reference recipe: --optimizer, --lr and --lr-gamma when the command line leaves
// them out (the linear model: the DDP tutorials' SGD 1e-3; the mlp and the autoencoder: the
// Fashion-MNIST tutorials' Adam 1e-3; the convnet: PyTorch's MNIST example, Adadelta 1.0 with
// StepLR 0.7; the LLaMA: the FSDP+TP recipe's AdamW 3e-3). docs/decisions.md says why.
struct Recipe {
  OptimizerKind optimizer;
  float lr;
  float lr_gamma;
};
Recipe recipe_for(ModelKind m);
// torch.optim's default learning rate, for an --optimizer other than the model's recipe.
float default_lr(OptimizerKind k);
// Every model's recipe in one line, for --help.
std::string recipes_text();

// The command line's words for the choices, as CLI11 reads them (the defaults are the flags').
struct ChoiceWords {
  std::string model;  // "": by the dataset
  std::string dataset = "fashion-mnist";
  std::string optimizer;         // "": the model's recipe
  bool lr_given = false;         // --lr was on the command line
  bool lr_gamma_given = false;   // --lr-gamma was
  std::string device = "auto";   // auto: cuda when a GPU is visible
  std::string backend = "auto";  // auto: nccl on cuda, else gloo
  std::string precision = "fp32";
  std::string sharding = "none";
};

// Sets the choices of `o` from the words; `cuda_visible` answers "auto" for --device (called
// only then). Throws ConfigError naming the flag and its choices, or a backend that does not fit
// the device.
void apply_choices(const ChoiceWords& words, const std::function<bool()>& cuda_visible,
                   TrainOptions& o);
// Checks the numbers and the combinations (ConfigError naming the option).
void validate(const TrainOptions& o);

}  // namespace ddp::train
