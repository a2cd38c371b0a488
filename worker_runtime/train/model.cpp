// Forward, loss and backward of ddp-train's models (see model.hpp).
#include "model.hpp"

#include <cblas.h>

#include <cmath>

#include "ddp/kernels/cpu_ref.hpp"
#include "ddp/proto/error.hpp"
#include "data.hpp"
#include "options.hpp"

namespace ddp::train {

namespace cpu = ddp::kernels::cpu;

ModelSpec model_spec(ModelKind kind) {
  ModelSpec s;
  s.name = to_string(kind);
  switch (kind) {
    case ModelKind::mlp:
      s.layers = {{784, 256, Act::relu}, {256, 128, Act::relu}, {128, 10, Act::none}};
      s.loss = Loss::cross_entropy;
      break;
    case ModelKind::autoencoder:
      s.layers = {{784, 128, Act::relu},
                  {128, 128, Act::relu},
                  {128, 128, Act::relu},
                  {128, 784, Act::sigmoid}};
      s.loss = Loss::mse;
      s.autoencoder = true;
      break;
    case ModelKind::linear:
      s.layers = {{20, 1, Act::none}};
      s.loss = Loss::mse;
      break;
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
    s.layers.push_back({in, width, Act::relu});
    in = width;
  }
  s.layers.push_back({in, 10, Act::none});
  return s;
}

std::size_t param_count(const ModelSpec& spec) {
  std::size_t n = 0;
  for (const auto& l : spec.layers) n += l.in * l.out + l.out;
  return n;
}

Model::Model(ModelSpec spec) : spec_(std::move(spec)) {
  const std::size_t nl = spec_.layers.size();
  slots_.resize(nl);
  std::size_t off = 0;
  for (std::size_t k = nl; k-- > 0;) {  // the last layer first
    const LayerSpec& l = spec_.layers[k];
    slots_[k].w = off;
    slots_[k].b = off + l.in * l.out;
    slots_[k].end = slots_[k].b + l.out;
    off = slots_[k].end;
  }
  params_.assign(off, 0.0f);
  grads_.assign(off, 0.0f);
  acts_.resize(nl);
}

void Model::init(std::uint64_t seed) {
  SplitMix64 rng(seed * 0x2545F4914F6CDD1Dull + 1);
  for (std::size_t k = 0; k < spec_.layers.size(); ++k) {
    const LayerSpec& l = spec_.layers[k];
    const float bound = 1.0f / std::sqrt(static_cast<float>(l.in));
    for (std::size_t i = slots_[k].w; i < slots_[k].end; ++i) {
      params_[i] = (2.0f * rng.uniform() - 1.0f) * bound;
    }
  }
}

void Model::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

const float* Model::forward(const float* x, std::size_t rows) {
  const float* in = x;
  for (std::size_t k = 0; k < spec_.layers.size(); ++k) {
    const LayerSpec& l = spec_.layers[k];
    std::vector<float>& y = acts_[k];
    y.resize(rows * l.out);
    // y = in · Wᵀ, then + b and the activation.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                static_cast<int>(l.out), static_cast<int>(l.in), 1.0f, in, static_cast<int>(l.in),
                params_.data() + slots_[k].w, static_cast<int>(l.in), 0.0f, y.data(),
                static_cast<int>(l.out));
    cpu::add_bias(y.data(), params_.data() + slots_[k].b, rows, l.out);
    if (l.act == Act::relu) cpu::relu_forward(y.data(), y.size());
    if (l.act == Act::sigmoid) cpu::sigmoid_forward(y.data(), y.size());
    in = y.data();
  }
  return in;
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
    const LayerSpec& l = spec_.layers[k];
    const std::vector<float>& y = acts_[k];
    if (l.act == Act::relu) cpu::relu_backward(delta_.data(), y.data(), y.size());
    if (l.act == Act::sigmoid) cpu::sigmoid_backward(delta_.data(), y.data(), y.size());
    const float* in = k == 0 ? x : acts_[k - 1].data();
    // dW += deltaᵀ · in ; db += column sums of delta.
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(l.out),
                static_cast<int>(l.in), static_cast<int>(rows), 1.0f, delta_.data(),
                static_cast<int>(l.out), in, static_cast<int>(l.in), 1.0f,
                grads_.data() + slots_[k].w, static_cast<int>(l.in));
    cpu::sum_rows(delta_.data(), grads_.data() + slots_[k].b, rows, l.out);
    if (layer_done) layer_done(k);  // its all-reduce overlaps the rest of backward
    if (k > 0) {
      // d(in) = delta · W
      delta_prev_.resize(rows * l.in);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                  static_cast<int>(l.in), static_cast<int>(l.out), 1.0f, delta_.data(),
                  static_cast<int>(l.out), params_.data() + slots_[k].w, static_cast<int>(l.in),
                  0.0f, delta_prev_.data(), static_cast<int>(l.in));
      delta_.swap(delta_prev_);
    }
  }
}

}  // namespace ddp::train
