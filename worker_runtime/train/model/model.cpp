// Forward, loss and backward of ddp-train's models (see model.hpp).
#include "model.hpp"

#include <cblas.h>

#include <cmath>

#include "conv_gemm.hpp"
#include "ddp/kernels/conv_ref.hpp"
#include "ddp/kernels/cpu_ref.hpp"
#include "ddp/proto/error.hpp"
#include "data.hpp"
#include "relu_pool.hpp"
#include "choice_names.hpp"

namespace ddp::train {
namespace {
constexpr choice_names::Name<ModelKind> kModels[] = {{ModelKind::mlp, "mlp"},
                                                     {ModelKind::autoencoder, "autoencoder"},
                                                     {ModelKind::linear, "linear"},
                                                     {ModelKind::convnet, "convnet"},
                                                     {ModelKind::llama, "llama"}};
}  // namespace

std::string to_string(ModelKind m) { return choice_names::name_of(kModels, m); }
std::optional<ModelKind> model_named(std::string_view name) {
  return choice_names::find(kModels, name);
}
ModelKind parse_model(std::string_view name) {
  return choice_names::parse(kModels, name, "--model",
                             "mlp, autoencoder, linear, convnet or llama");
}

namespace cpu = ddp::kernels::cpu;

// The element-wise layers split their work over the conv threads (conv_gemm.hpp) when there is
// enough of it: a convolution's activations, not a small linear layer's.
constexpr std::size_t kMinPerThread = std::size_t{1} << 16;
// A ReLU then a 2x2 pool: one fused pass (relu_pool.hpp) instead of the three references.
static bool fused_relu_pool(const LayerSpec& l) { return l.pool == 2 && l.act == Act::relu; }

std::size_t LayerSpec::weight_count() const {
  return kind == LayerKind::conv2d ? out_c * in_c * kernel * kernel : in * out;
}

std::size_t LayerSpec::bias_count() const { return kind == LayerKind::conv2d ? out_c : out; }

std::size_t LayerSpec::pre_pool() const {
  return kind == LayerKind::conv2d ? out_c * conv_out_h() * conv_out_w() : out;
}

LayerSpec conv_layer(std::size_t in_c, std::size_t in_h, std::size_t in_w, std::size_t out_c,
                     std::size_t kernel, Act act, std::size_t pool, float dropout) {
  LayerSpec l;
  l.kind = LayerKind::conv2d;
  l.in_c = in_c;
  l.in_h = in_h;
  l.in_w = in_w;
  l.out_c = out_c;
  l.kernel = kernel;
  l.act = act;
  l.pool = pool;
  l.dropout = dropout;
  l.in = in_c * in_h * in_w;
  const std::size_t p = pool > 1 ? pool : 1;
  l.out = out_c * (l.conv_out_h() / p) * (l.conv_out_w() / p);
  return l;
}

namespace {

LayerSpec linear_layer(std::size_t in, std::size_t out, Act act, float dropout = 0.0f) {
  LayerSpec l;
  l.in = in;
  l.out = out;
  l.act = act;
  l.dropout = dropout;
  return l;
}

kernels::Conv2dShape conv_shape(const LayerSpec& l, std::size_t rows) {
  return {rows, l.in_c, l.in_h, l.in_w, l.out_c, l.kernel, l.kernel};
}

std::size_t fan_in(const LayerSpec& l) {
  return l.kind == LayerKind::conv2d ? l.in_c * l.kernel * l.kernel : l.in;
}

}  // namespace

ModelSpec model_spec(ModelKind kind) {
  ModelSpec s;
  s.name = to_string(kind);
  switch (kind) {
    case ModelKind::mlp:
      s.layers = {linear_layer(784, 256, Act::relu), linear_layer(256, 128, Act::relu),
                  linear_layer(128, 10, Act::none)};
      s.loss = Loss::cross_entropy;
      break;
    case ModelKind::autoencoder:
      s.layers = {linear_layer(784, 128, Act::relu), linear_layer(128, 128, Act::relu),
                  linear_layer(128, 128, Act::relu), linear_layer(128, 784, Act::sigmoid)};
      s.loss = Loss::mse;
      s.autoencoder = true;
      break;
    case ModelKind::linear:
      s.layers = {linear_layer(20, 1, Act::none)};
      s.loss = Loss::mse;
      break;
    case ModelKind::convnet:
      // PyTorch's examples/mnist Net: conv1 1->32 3x3, ReLU, conv2 32->64 3x3, ReLU, max-pool 2,
      // dropout 0.25, flatten, fc1 9216->128, ReLU, dropout 0.5, fc2 128->10, log-softmax + NLL
      // (softmax cross-entropy).
      s.layers = {conv_layer(1, 28, 28, 32, 3, Act::relu, 0, 0.0f),
                  conv_layer(32, 26, 26, 64, 3, Act::relu, 2, 0.25f),
                  linear_layer(9216, 128, Act::relu, 0.5f), linear_layer(128, 10, Act::none)};
      s.loss = Loss::cross_entropy;
      break;
    case ModelKind::llama:
      throw ConfigError("--model llama is a transformer (lm_spec.hpp), not a stack of layers");
  }
  return s;
}

ModelSpec model_spec(const std::string& name) { return model_spec(parse_model(name)); }

ModelSpec model_spec(ModelKind kind, std::size_t hidden, int layers) {
  ModelSpec s = model_spec(kind);
  if (kind != ModelKind::mlp || (hidden == 0 && layers == 0)) return s;
  const std::size_t width = hidden != 0 ? hidden : 256;
  const int depth = layers != 0 ? layers : 2;
  s.layers.clear();
  std::size_t in = 784;
  for (int i = 0; i < depth; ++i) {
    s.layers.push_back(linear_layer(in, width, Act::relu));
    in = width;
  }
  s.layers.push_back(linear_layer(in, 10, Act::none));
  return s;
}

std::size_t param_count(const ModelSpec& spec) {
  std::size_t n = 0;
  for (const auto& l : spec.layers) n += l.param_count();
  return n;
}

std::vector<LayerSlot> layout_slots(const ModelSpec& spec) {
  const std::size_t nl = spec.layers.size();
  std::vector<LayerSlot> slots(nl);
  std::size_t off = 0;
  for (std::size_t k = nl; k-- > 0;) {  // the last layer first
    const LayerSpec& l = spec.layers[k];
    slots[k].w = off;
    slots[k].b = off + l.weight_count();
    slots[k].end = slots[k].b + l.bias_count();
    off = slots[k].end;
  }
  return slots;
}

void init_slice(const ModelSpec& spec, std::uint64_t seed, std::size_t k, std::size_t lo,
                std::size_t hi, float* out) {
  // One SplitMix64 stream over the layers in forward order, one draw per element; the stream's
  // state after n draws is its start plus n times its increment, so a slice starts anywhere.
  std::size_t before = lo;
  for (std::size_t j = 0; j < k; ++j) before += spec.layers[j].param_count();
  SplitMix64 rng(seed * 0x2545F4914F6CDD1Dull + 1);
  rng.state += static_cast<std::uint64_t>(before) * 0x9E3779B97F4A7C15ull;
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in(spec.layers[k])));
  for (std::size_t i = lo; i < hi; ++i) out[i - lo] = (2.0f * rng.uniform() - 1.0f) * bound;
}

Model::Model(ModelSpec spec, bool own_buffers)
    : spec_(std::move(spec)), slots_(layout_slots(spec_)), count_(train::param_count(spec_)) {
  for (const auto& l : spec_.layers) {
    if (l.dropout > 0.0f && l.act == Act::sigmoid) {
      throw ConfigError(spec_.name + ": dropout after a sigmoid is not supported");
    }
  }
  if (own_buffers) {
    params_.assign(count_, 0.0f);
    grads_.assign(count_, 0.0f);
  }
  const std::size_t nl = spec_.layers.size();
  acts_.resize(nl);
  pre_.resize(nl);
  argmax_.resize(nl);
}

void Model::init(std::uint64_t seed) {
  if (params_.empty()) return;
  for (std::size_t k = 0; k < spec_.layers.size(); ++k) {
    init_slice(spec_, seed, k, 0, slots_[k].size(), params_.data() + slots_[k].w);
  }
}

void Model::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

const float* Model::forward(const float* x, std::size_t rows, bool training) {
  for (std::size_t k = 0; k < spec_.layers.size(); ++k) {
    layer_forward(k, k == 0 ? x : acts_[k - 1].data(), rows, training);
  }
  return acts_.back().data();
}

void Model::layer_forward(std::size_t k, const float* in, std::size_t rows, bool training) {
  const LayerSpec& l = spec_.layers[k];
  const float* p = mem_->acquire(k, LayerMemory::Pass::forward);
  const float* w = p;
  const float* b = p + l.weight_count();
  // z: the activation's output, before pooling.
  std::vector<float>& z = l.pool > 1 ? pre_[k] : acts_[k];
  z.resize(rows * l.pre_pool());
  if (l.kind == LayerKind::conv2d) {
    conv2d_gemm_forward(in, w, b, z.data(), conv_shape(l, rows), scratch_);
  } else {
    // z = in · Wᵀ, then + b.
    parallel_sgemm(false, true, static_cast<int>(rows), static_cast<int>(l.out),
                   static_cast<int>(l.in), 1.0f, in, static_cast<int>(l.in), w,
                   static_cast<int>(l.in), 0.0f, z.data(), static_cast<int>(l.out));
    cpu::add_bias(z.data(), b, rows, l.out);
  }
  mem_->release(k, LayerMemory::Pass::forward);
  float* zp = z.data();
  const bool fused = fused_relu_pool(l);
  if (!fused) {
    parallel_ranges(z.size(), kMinPerThread, [&](std::size_t lo, std::size_t hi) {
      if (l.act == Act::relu) cpu::relu_forward(zp + lo, hi - lo);
      if (l.act == Act::sigmoid) cpu::sigmoid_forward(zp + lo, hi - lo);
    });
  }
  std::vector<float>& y = acts_[k];
  if (l.pool > 1) {
    const kernels::PoolShape ps{rows * l.out_c, l.conv_out_h(), l.conv_out_w(), l.pool};
    y.resize(ps.y_size());
    argmax_[k].resize(ps.y_size());
    const std::size_t in_plane = ps.in_h * ps.in_w;
    const std::size_t out_plane = ps.out_h() * ps.out_w();
    const float drop = training ? l.dropout : 0.0f;
    const std::uint64_t seed = kernels::mix64(dropout_seed_ + k);
    parallel_ranges(ps.planes, kMinPerThread / in_plane + 1, [&](std::size_t lo, std::size_t hi) {
      const kernels::PoolShape part{hi - lo, ps.in_h, ps.in_w, ps.k};
      if (fused) {
        relu_maxpool2_dropout_forward(zp + lo * in_plane, y.data() + lo * out_plane,
                                      argmax_[k].data() + lo * out_plane, part, drop, seed,
                                      lo * out_plane);
      } else {
        cpu::maxpool_forward(zp + lo * in_plane, y.data() + lo * out_plane,
                             argmax_[k].data() + lo * out_plane, part);
      }
    });
  }
  if (training && l.dropout > 0.0f && !fused) {
    float* yp = y.data();
    const std::uint64_t seed = kernels::mix64(dropout_seed_ + k);
    parallel_ranges(y.size(), kMinPerThread, [&](std::size_t lo, std::size_t hi) {
      cpu::dropout_forward(yp + lo, yp + lo, nullptr, hi - lo, l.dropout, seed, lo);
    });
  }
}

double Model::loss(const std::uint8_t* labels, const float* targets, std::size_t rows,
                   float scale) {
  const std::vector<float>& out = acts_.back();
  delta_.resize(out.size());
  if (spec_.loss == Loss::cross_entropy) {
    return cpu::softmax_xent(out.data(), labels, delta_.data(), rows, spec_.layers.back().out,
                             scale);
  }
  // torch's MSELoss(reduction="mean") averages over every element: divide by out too.
  const std::size_t out_dim = spec_.layers.back().out;
  const double sum =
      cpu::mse(out.data(), targets, delta_.data(), out.size(), scale / static_cast<float>(out_dim));
  return sum / static_cast<double>(out_dim);
}

void Model::backward(const float* x, std::size_t rows,
                     const std::function<void(std::size_t)>& layer_done) {
  for (std::size_t k = spec_.layers.size(); k-- > 0;) {
    layer_backward(k, k == 0 ? x : acts_[k - 1].data(), rows, layer_done);
    if (k > 0) delta_.swap(delta_prev_);
    mem_->release(k, LayerMemory::Pass::backward);
  }
}

// delta_ holds dL/d(layer k's output); adds layer k's gradients, calls layer_done(k) (its
// all-reduce overlaps the rest of backward) and, for k > 0, leaves dL/d(its input) in
// delta_prev_.
void Model::layer_backward(std::size_t k, const float* in, std::size_t rows,
                           const std::function<void(std::size_t)>& layer_done) {
  const LayerSpec& l = spec_.layers[k];
  const float* p = mem_->acquire(k, LayerMemory::Pass::backward);
  float* g = mem_->grads(k);
  const bool fused = fused_relu_pool(l);
  if (l.dropout > 0.0f && !fused) {
    float* d = delta_.data();
    const std::uint64_t seed = kernels::mix64(dropout_seed_ + k);
    parallel_ranges(delta_.size(), kMinPerThread, [&](std::size_t lo, std::size_t hi) {
      cpu::dropout_backward(d + lo, d + lo, hi - lo, l.dropout, seed, lo);
    });
  }
  // dz: the gradient w.r.t. the activation's output, z its values.
  std::vector<float>* dz = &delta_;
  const std::vector<float>& z = l.pool > 1 ? pre_[k] : acts_[k];
  if (l.pool > 1) {
    const kernels::PoolShape ps{rows * l.out_c, l.conv_out_h(), l.conv_out_w(), l.pool};
    scratch2_.resize(ps.x_size());
    const std::size_t in_plane = ps.in_h * ps.in_w;
    const std::size_t out_plane = ps.out_h() * ps.out_w();
    const float scale = l.dropout > 0.0f ? kernels::dropout_scale(l.dropout) : 1.0f;
    const float* y = acts_[k].data();
    parallel_ranges(ps.planes, kMinPerThread / in_plane + 1, [&](std::size_t lo, std::size_t hi) {
      const kernels::PoolShape part{hi - lo, ps.in_h, ps.in_w, ps.k};
      if (fused) {
        relu_maxpool2_dropout_backward(
            delta_.data() + lo * out_plane, y + lo * out_plane, argmax_[k].data() + lo * out_plane,
            scratch2_.data() + lo * in_plane, part, scale, l.dropout > 0.0f);
      } else {
        cpu::maxpool_backward(delta_.data() + lo * out_plane, argmax_[k].data() + lo * out_plane,
                              scratch2_.data() + lo * in_plane, part);
      }
    });
    dz = &scratch2_;
  }
  float* dzp = dz->data();
  const float* zp = z.data();
  if (!fused) {
    parallel_ranges(z.size(), kMinPerThread, [&](std::size_t lo, std::size_t hi) {
      if (l.act == Act::relu) cpu::relu_backward(dzp + lo, zp + lo, hi - lo);
      if (l.act == Act::sigmoid) cpu::sigmoid_backward(dzp + lo, zp + lo, hi - lo);
    });
  }
  const float* w = p;
  float* gw = g;
  float* gb = g + l.weight_count();
  if (k > 0) delta_prev_.resize(rows * l.in);
  if (l.kind == LayerKind::conv2d) {
    conv2d_gemm_backward(dz->data(), in, w, k > 0 ? delta_prev_.data() : nullptr, gw, gb,
                         conv_shape(l, rows), scratch_);
    if (layer_done) layer_done(k);
    return;
  }
  // dW += dzᵀ · in ; db += column sums of dz.
  parallel_sgemm(true, false, static_cast<int>(l.out), static_cast<int>(l.in),
                 static_cast<int>(rows), 1.0f, dz->data(), static_cast<int>(l.out), in,
                 static_cast<int>(l.in), 1.0f, gw, static_cast<int>(l.in));
  cpu::sum_rows(dz->data(), gb, rows, l.out);
  if (layer_done) layer_done(k);
  if (k > 0) {
    // d(in) = dz · W
    parallel_sgemm(false, false, static_cast<int>(rows), static_cast<int>(l.in),
                   static_cast<int>(l.out), 1.0f, dz->data(), static_cast<int>(l.out), w,
                   static_cast<int>(l.in), 0.0f, delta_prev_.data(), static_cast<int>(l.in));
  }
}

}  // namespace ddp::train
