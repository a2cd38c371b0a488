// The models of ddp-train: a stack of layers (Linear or Conv2d, each followed by an activation,
// an optional max-pool and an optional dropout) and a loss. Parameters and gradients have one
// flat layout: the last layer first (each layer's weight, then its bias: its "slot"), so that
// gradients fill the buffer from its start as backward runs, and all-reduce buckets are
// contiguous. Where a layer's parameters are read from and its gradients written to is a
// LayerMemory: the model's own flat buffers (replicated training), or copies a sharded engine
// gathers just before the layer runs and frees after (sharded_engine.cpp). Matrix products go
// through BLAS (convolutions as im2col + sgemm, conv_gemm.hpp); the element-wise parts are the
// CPU references in ddp_kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddp::train {

enum class ModelKind { mlp, autoencoder, linear, convnet, llama };  // --model
// A model's name ("mlp", ...), and back: model_named gives nullopt for an unknown name (names read
// from a snapshot), parse_model throws ConfigError "--model 'x': expected mlp, autoencoder, linear,
// convnet or llama".
std::string to_string(ModelKind m);
std::optional<ModelKind> model_named(std::string_view name);
ModelKind parse_model(std::string_view name);
enum class Act { none, relu, sigmoid };
enum class Loss { cross_entropy, mse };
enum class LayerKind { linear, conv2d };

struct LayerSpec {
  std::size_t in = 0;   // inputs per sample (a conv layer's in_c * in_h * in_w)
  std::size_t out = 0;  // outputs per sample, after the activation and the pooling
  Act act = Act::none;
  LayerKind kind = LayerKind::linear;
  // conv2d (stride 1, no padding, square kernel): the input planes and the output channels.
  std::size_t in_c = 0;
  std::size_t in_h = 0;
  std::size_t in_w = 0;
  std::size_t out_c = 0;
  std::size_t kernel = 0;
  std::size_t pool = 0;  // k > 1: a k x k max-pool with stride k after the activation
  float dropout = 0.0f;  // p > 0: inverted dropout last (training only)

  std::size_t weight_count() const;
  std::size_t bias_count() const;
  std::size_t param_count() const { return weight_count() + bias_count(); }
  // A conv layer's output size before pooling; a linear layer's `out`.
  std::size_t conv_out_h() const { return in_h - kernel + 1; }
  std::size_t conv_out_w() const { return in_w - kernel + 1; }
  std::size_t pre_pool() const;
};

// A conv2d layer's spec from its input planes (outputs sized by the kernel and the pool).
LayerSpec conv_layer(std::size_t in_c, std::size_t in_h, std::size_t in_w, std::size_t out_c,
                     std::size_t kernel, Act act, std::size_t pool, float dropout);

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
// By name ("mlp", "autoencoder", "linear", "convnet"), for tests; throws ConfigError naming the
// choices.
ModelSpec model_spec(const std::string& name);

struct LayerSlot {
  std::size_t w = 0;  // offset of the weight in the flat buffers
  std::size_t b = 0;  // offset of the bias
  std::size_t end = 0;
  std::size_t size() const { return end - w; }
};

// The flat layout of a spec's parameters (Model::slots() without a Model).
std::vector<LayerSlot> layout_slots(const ModelSpec& spec);

// torch's initialisation (nn.Linear and nn.Conv2d: uniform in +-1/sqrt(fan_in)) of elements
// [lo, hi) of layer k's slot, as Model::init(seed) draws them: one random stream over the
// layers in forward order, so any slice is drawn without drawing the rest (a shard's).
void init_slice(const ModelSpec& spec, std::uint64_t seed, std::size_t k, std::size_t lo,
                std::size_t hi, float* out);

// Where the model reads layer k's parameters (slot layout: weight, then bias) and adds its
// gradients. Calls come in a fixed order: forward acquires and releases layers 0, 1, ...;
// backward acquires layer k, takes grads(k), finishes it (the model's layer_done callback),
// then releases it, from the last layer down.
class LayerMemory {
 public:
  enum class Pass { forward, backward };
  virtual ~LayerMemory() = default;
  virtual const float* acquire(std::size_t k, Pass pass) = 0;  // valid until release(k, pass)
  virtual void release(std::size_t k, Pass pass) = 0;
  virtual float* grads(std::size_t k) = 0;  // valid during layer k's backward
};

class Model {
 public:
  // own_buffers = false: no flat parameter and gradient buffers (params() and grads() stay
  // empty); set_memory() must then name where the layers live.
  explicit Model(ModelSpec spec, bool own_buffers = true);
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelSpec& spec() const { return spec_; }
  std::size_t param_count() const { return count_; }
  std::vector<float>& params() { return params_; }
  std::vector<float>& grads() { return grads_; }
  const std::vector<LayerSlot>& slots() const { return slots_; }
  void set_memory(LayerMemory* memory) { mem_ = memory != nullptr ? memory : &own_; }

  // torch's initialisation of the own buffers (init_slice over every layer).
  void init(std::uint64_t seed);
  void zero_grads();
  // The seed of the dropout masks of the next forward in training (one per micro-batch).
  void set_dropout_seed(std::uint64_t seed) { dropout_seed_ = seed; }

  // Runs the layers on x [rows][in]; returns the output [rows][out] (owned by the model).
  // training: dropout on (and what backward needs is kept); off for evaluation.
  const float* forward(const float* x, std::size_t rows, bool training = false);
  // Loss of the last forward against the targets; fills the output gradient, scaled so the
  // loss is `scale` times the sum over the batch (pass 1/rows for the mean). Returns the
  // unscaled summed loss. labels for cross-entropy; targets [rows][out] for mse.
  double loss(const std::uint8_t* labels, const float* targets, std::size_t rows, float scale);
  // Accumulates the gradients of the last forward into the memory's grads; calls
  // layer_done(i) after layer i's gradients are complete, from the last layer down to 0.
  void backward(const float* x, std::size_t rows,
                const std::function<void(std::size_t)>& layer_done);

 private:
  class OwnMemory final : public LayerMemory {
   public:
    explicit OwnMemory(Model& m) : m_(m) {}
    const float* acquire(std::size_t k, Pass) override {
      return m_.params_.data() + m_.slots_[k].w;
    }
    void release(std::size_t, Pass) override {}
    float* grads(std::size_t k) override { return m_.grads_.data() + m_.slots_[k].w; }

   private:
    Model& m_;
  };
  void layer_forward(std::size_t k, const float* in, std::size_t rows, bool training);
  void layer_backward(std::size_t k, const float* in, std::size_t rows,
                      const std::function<void(std::size_t)>& layer_done);

  ModelSpec spec_;
  std::vector<LayerSlot> slots_;
  std::size_t count_ = 0;
  std::vector<float> params_;
  std::vector<float> grads_;
  OwnMemory own_{*this};
  LayerMemory* mem_ = &own_;
  std::uint64_t dropout_seed_ = 0;
  std::vector<std::vector<float>> acts_;  // acts_[i]: output of layer i (what layer i+1 reads)
  std::vector<std::vector<float>> pre_;   // a conv/pool/dropout layer's output before pooling
  std::vector<std::vector<std::int32_t>> argmax_;  // the max-pool's choices
  std::vector<float> delta_;                       // gradient w.r.t. the current layer's output
  std::vector<float> delta_prev_;
  std::vector<float> scratch_;  // im2col columns and the pre-pool gradient
  std::vector<float> scratch2_;
};

}  // namespace ddp::train
