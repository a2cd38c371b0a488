// The fused ReLU + 2x2 max-pool + dropout of relu_pool.hpp.
#include "relu_pool.hpp"

#include <cmath>
#include <cstring>

#include "ddp/proto/error.hpp"

namespace ddp::train {

namespace {
inline float relu(float v) { return v > 0.0f ? v : 0.0f; }  // NaN -> 0, as cpu::relu_forward

// One output row: the windows over input rows r0 and r0 + in_w. maxpool_forward's scan over
// relu'd values (never NaN, never below 0): the first element always beats -inf, a later one
// wins only when strictly larger. Selects, not branches: the vectorizer takes the loop (-O3),
// and random activations would mispredict half the branches.
void pool_row(const float* __restrict r0, std::size_t in_w, std::size_t ow, std::int32_t at0,
              float* __restrict y, std::int32_t* __restrict argmax) {
  const float* __restrict r1 = r0 + in_w;
  const auto w = static_cast<std::int32_t>(in_w);
  for (std::size_t ox = 0; ox < ow; ++ox) {
    const std::int32_t at = at0 + 2 * static_cast<std::int32_t>(ox);
    float top = relu(r0[2 * ox]);
    std::int32_t best = at;
    const float b = relu(r0[2 * ox + 1]);
    best = b > top ? at + 1 : best;
    top = b > top ? b : top;
    const float c = relu(r1[2 * ox]);
    best = c > top ? at + w : best;
    top = c > top ? c : top;
    const float d = relu(r1[2 * ox + 1]);
    best = d > top ? at + w + 1 : best;
    top = d > top ? d : top;
    y[ox] = top;
    argmax[ox] = best;
  }
}
}  // namespace

void relu_maxpool2_dropout_forward(const float* z, float* y, std::int32_t* argmax,
                                   const kernels::PoolShape& s, float p, std::uint64_t seed,
                                   std::uint64_t offset) {
  kernels::check_shape(s);
  if (s.k != 2) throw ConfigError("relu_maxpool2: a 2x2 pool only, not " + std::to_string(s.k));
  const std::size_t oh = s.out_h(), ow = s.out_w(), in_w = s.in_w;
  const std::size_t in_plane = s.in_h * in_w;
  const bool drop = p > 0.0f;
  const std::uint32_t threshold = drop ? kernels::dropout_threshold(p) : 0;
  const float scale = drop ? kernels::dropout_scale(p) : 1.0f;
  for (std::size_t pl = 0; pl < s.planes; ++pl) {
    const float* zp = z + pl * in_plane;
    for (std::size_t oy = 0; oy < oh; ++oy) {
      const std::size_t j0 = (pl * oh + oy) * ow;
      pool_row(zp + 2 * oy * in_w, in_w, ow, static_cast<std::int32_t>(2 * oy * in_w), y + j0,
               argmax + j0);
      if (!drop) continue;
      for (std::size_t ox = 0; ox < ow; ++ox) {
        const bool keep = kernels::dropout_bits(seed, offset + j0 + ox) >= threshold;
        y[j0 + ox] = keep ? y[j0 + ox] * scale : 0.0f;
      }
    }
  }
}

void relu_maxpool2_dropout_backward(const float* dy, const float* y, const std::int32_t* argmax,
                                    float* dz, const kernels::PoolShape& s, float scale,
                                    bool dropout) {
  kernels::check_shape(s);
  const std::size_t in_plane = s.in_h * s.in_w, out_plane = s.out_h() * s.out_w();
  // A memset then a scatter: faster here than writing each window whole (strided selects).
  std::memset(dz, 0, s.x_size() * sizeof(float));
  for (std::size_t pl = 0; pl < s.planes; ++pl) {
    float* dzp = dz + pl * in_plane;
    for (std::size_t j = pl * out_plane; j < (pl + 1) * out_plane; ++j) {
      // y > 0: kept by dropout (scale >= 1 keeps it positive) and past the ReLU. Added to the
      // zero, as maxpool_backward does (a -0 gradient becomes +0 there too).
      if (y[j] > 0.0f) dzp[argmax[j]] += dropout ? dy[j] * scale : dy[j];
    }
  }
}

}  // namespace ddp::train
