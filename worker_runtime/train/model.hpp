// The models of ddp-train: a stack of Linear layers, each followed by an activation, and a loss.
// Parameters and gradients live in two flat buffers with the same layout: the last layer first
// (each layer's weight [out][in], then its bias), so that gradients fill the buffer from its
// start as backward runs, and all-reduce buckets are contiguous. Matrix products go through
// BLAS; the element-wise parts are the CPU references in ddp_kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddp::train {

enum class ModelKind { mlp, autoencoder, linear };  // --model (options.hpp names them)
enum class Act { none, relu, sigmoid };
enum class Loss { cross_entropy, mse };

struct LayerSpec {
  std::size_t in = 0;
  std::size_t out = 0;
  Act act = Act::none;
};

struct ModelSpec {
  std::string name;  // for messages: the --model name, or a test's label
  std::vector<LayerSpec> layers;
  Loss loss = Loss::mse;
  bool autoencoder = false;  // the target is the input
};

ModelSpec model_spec(ModelKind kind);
// The mlp with `layers` hidden layers of `hidden` units (ReLU) between 784 inputs and 10
// classes; 0 for either keeps the default (784-256-128-10). Other kinds ignore both.
ModelSpec model_spec(ModelKind kind, std::size_t hidden, int layers);
std::size_t param_count(const ModelSpec& spec);  // weights and biases of every layer
inline constexpr std::size_t kMaxHidden = 65536;
inline constexpr int kMaxLayers = 64;
inline constexpr std::size_t kMaxParams = std::size_t{1} << 30;  // 4 GiB of fp32 weights
// By name ("mlp", "autoencoder", "linear"), for tests; throws ConfigError naming the choices.
ModelSpec model_spec(const std::string& name);

struct LayerSlot {
  std::size_t w = 0;  // offset of the weight in the flat buffers
  std::size_t b = 0;  // offset of the bias
  std::size_t end = 0;
};

class Model {
 public:
  explicit Model(ModelSpec spec);

  const ModelSpec& spec() const { return spec_; }
  std::size_t param_count() const { return params_.size(); }
  std::vector<float>& params() { return params_; }
  std::vector<float>& grads() { return grads_; }
  const std::vector<LayerSlot>& slots() const { return slots_; }

  // torch's nn.Linear initialisation: weight and bias uniform in +-1/sqrt(fan_in).
  void init(std::uint64_t seed);
  void zero_grads();

  // Runs the layers on x [rows][in]; returns the output [rows][out] (owned by the model).
  const float* forward(const float* x, std::size_t rows);
  // Loss of the last forward against the targets; fills the output gradient, scaled so the
  // loss is `scale` times the sum over the batch (pass 1/rows for the mean). Returns the
  // unscaled summed loss. labels for cross-entropy; targets [rows][out] for mse.
  double loss(const std::uint8_t* labels, const float* targets, std::size_t rows, float scale);
  // Accumulates the gradients of the last forward into grads(); calls layer_done(i) after
  // layer i's gradients are complete, from the last layer down to 0.
  void backward(const float* x, std::size_t rows,
                const std::function<void(std::size_t)>& layer_done);

 private:
  ModelSpec spec_;
  std::vector<LayerSlot> slots_;
  std::vector<float> params_;
  std::vector<float> grads_;
  std::vector<std::vector<float>> acts_;  // acts_[i]: output of layer i after its activation
  std::vector<float> delta_;              // gradient w.r.t. the current layer's output
  std::vector<float> delta_prev_;
};

}  // namespace ddp::train
