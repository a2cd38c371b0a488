// ddp-train's options, parsed once: main.cpp reads the command line (CLI11) into ChoiceWords and
// the numbers, apply_choices() turns the words into enums, validate() checks the rest. Past this
// file nothing compares option strings; to_string() names a choice for messages, the metrics
// file and snapshots. DDP_TRAIN_FAULT ("RANK:STEP") is parsed here too (parse_fault).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "model.hpp"
#include "optimizer.hpp"

namespace ddp::train {

enum class Device { cpu, cuda };
enum class Backend { gloo, nccl };  // host collectives for cpu, NCCL for cuda
enum class Precision { fp32, bf16 };
enum class DatasetKind { fashion_mnist, synthetic };

std::string to_string(Device d);
std::string to_string(Backend b);
std::string to_string(Precision p);
std::string to_string(DatasetKind d);
std::string to_string(ModelKind m);
std::string to_string(OptimizerKind k);

// A name's choice, or nullopt (no throw): for names read back from a snapshot.
std::optional<ModelKind> model_named(std::string_view name);
std::optional<OptimizerKind> optimizer_named(std::string_view name);
// The same, throwing ConfigError "--model 'x': expected mlp, autoencoder or linear".
ModelKind parse_model(std::string_view name);

// DDP_TRAIN_FAULT: rank `rank` kills itself (SIGKILL) before global step `step`, in the first
// attempt only. rank -1: no fault.
struct Fault {
  int rank = -1;
  std::int64_t step = -1;
};
// "" is no fault; else "RANK:STEP" or ConfigError naming DDP_TRAIN_FAULT.
Fault parse_fault(const std::string& text);

struct TrainOptions {
  int total_epochs = 0;
  int save_every = 0;
  int batch_size = 32;
  ModelKind model = ModelKind::mlp;  // --model; without it, linear for the synthetic dataset
  DatasetKind dataset = DatasetKind::fashion_mnist;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::size_t train_subset = 0;
  std::size_t synthetic_size = 2048;
  OptimizerConfig optimizer;
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
};

// The command line's words for the choices, as CLI11 reads them (the defaults are the flags').
struct ChoiceWords {
  std::string model;  // "": by the dataset
  std::string dataset = "fashion-mnist";
  std::string optimizer = "sgd";
  std::string device = "auto";   // auto: cuda when a GPU is visible
  std::string backend = "auto";  // auto: nccl on cuda, else gloo
  std::string precision = "fp32";
};

// Sets the choices of `o` from the words; `cuda_visible` answers "auto" for --device (called
// only then). Throws ConfigError naming the flag and its choices, or a backend that does not fit
// the device.
void apply_choices(const ChoiceWords& words, const std::function<bool()>& cuda_visible,
                   TrainOptions& o);
// Checks the numbers and the combinations (ConfigError naming the option).
void validate(const TrainOptions& o);

}  // namespace ddp::train
