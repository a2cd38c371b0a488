// Causal scaled dot-product attention, forward and backward, straightforward rather than fast
// (no tiling, no tensor cores): a warp per (sequence, head, query row) or per key row, each sum
// made by one lane or one warp's butterfly in a fixed order, so runs repeat bit for bit.
// Backward, with s = 1/sqrt(head_dim), P = att, dP_ij = dout_i . v_j, D_i = sum_j P_ij dP_ij:
//   1. D_i per query row, parked in dq's first element of that (row, head) slot;
//   2. per key j: dv_j = sum_{i>=j} P_ij dout_i, dk_j = s sum_{i>=j} P_ij (dP_ij - D_i) q_i;
//   3. per query i: dq_i = s sum_{j<=i} P_ij (dP_ij - D_i) k_j, overwriting the parked D_i.
#include "../warp_reduce.cuh"

#include "ddp/kernels/lm_ops.hpp"

namespace ddp::kernels::cuda {
namespace {

constexpr unsigned kWarps = 4;  // warps per block in the backward kernels

struct Dims {
  std::size_t batch, seq, heads, head_dim;
};

// Where the (sequence b, position i, head h) vector of q, k, v, out starts.
__device__ inline std::size_t at(const Dims& d, std::size_t b, std::size_t i, std::size_t h) {
  return ((b * d.seq + i) * d.heads + h) * d.head_dim;
}

__device__ inline float dot(const float* a, const float* b, std::size_t n) {
  float acc = 0.0f;
  for (std::size_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

// The dot product of two vectors, a lane per element, every lane getting it.
__device__ inline float warp_dot(const float* a, const float* b, std::size_t n, unsigned lane) {
  float acc = 0.0f;
  for (std::size_t i = lane; i < n; i += 32) acc += a[i] * b[i];
  return detail::warp_sum(acc);
}

// Warp w is query row i = w % seq of head h, sequence b (w / seq = b * heads + h).
__global__ void attention_forward_kernel(const float* q, const float* k, const float* v, float* att,
                                         float* out, Dims d, float scale) {
  const unsigned lane = threadIdx.x % 32;
  const std::size_t ld = d.heads * d.head_dim;  // from one position to the next
  const std::size_t total = d.batch * d.heads * d.seq;
  for (std::size_t w = detail::warp_start(); w < total; w += detail::warp_step()) {
    const std::size_t i = w % d.seq, bh = w / d.seq, h = bh % d.heads, b = bh / d.heads;
    const float* qi = q + at(d, b, i, h);
    const float* kb = k + at(d, b, 0, h);
    const float* vb = v + at(d, b, 0, h);
    float* a = att + w * d.seq;  // [b][h][i][:]
    float mx = -INFINITY;
    for (std::size_t j = lane; j <= i; j += 32) {
      const float s = dot(qi, kb + j * ld, d.head_dim) * scale;
      a[j] = s;
      mx = fmaxf(mx, s);
    }
    mx = detail::warp_max(mx);
    float sum = 0.0f;
    for (std::size_t j = lane; j <= i; j += 32) {
      const float e = expf(a[j] - mx);
      a[j] = e;
      sum += e;
    }
    const float inv = 1.0f / detail::warp_sum(sum);
    for (std::size_t j = lane; j <= i; j += 32) a[j] *= inv;
    for (std::size_t j = i + 1 + lane; j < d.seq; j += 32) a[j] = 0.0f;
    __syncwarp();  // the row's probabilities, written by all lanes, are read by all below
    float* oi = out + at(d, b, i, h);
    for (std::size_t c = lane; c < d.head_dim; c += 32) {
      float acc = 0.0f;
      for (std::size_t j = 0; j <= i; ++j) acc += a[j] * vb[j * ld + c];
      oi[c] = acc;
    }
  }
}

// 1. D_i = sum_{j<=i} att_ij (dout_i . v_j), a warp per query row, into dq's parking slot.
__global__ void attention_backward_d_kernel(const float* dout, const float* v, const float* att,
                                            float* dq, Dims d) {
  const unsigned lane = threadIdx.x % 32;
  const std::size_t ld = d.heads * d.head_dim;
  const std::size_t total = d.batch * d.heads * d.seq;
  for (std::size_t w = detail::warp_start(); w < total; w += detail::warp_step()) {
    const std::size_t i = w % d.seq, bh = w / d.seq, h = bh % d.heads, b = bh / d.heads;
    const float* doi = dout + at(d, b, i, h);
    const float* vb = v + at(d, b, 0, h);
    const float* a = att + w * d.seq;
    float acc = 0.0f;
    for (std::size_t j = lane; j <= i; j += 32) acc += a[j] * dot(doi, vb + j * ld, d.head_dim);
    acc = detail::warp_sum(acc);
    if (lane == 0) dq[at(d, b, i, h)] = acc;
  }
}

// 2. dk_j and dv_j, a warp per key row j (w % seq), the sums over i >= j in order in shared
// memory (2 * head_dim floats per warp; each lane owns the same elements throughout).
__global__ void attention_backward_dkdv_kernel(const float* dout, const float* q, const float* v,
                                               const float* att, const float* dq, float* dk,
                                               float* dv, Dims d, float scale) {
  extern __shared__ float smem[];
  const unsigned lane = threadIdx.x % 32;
  float* sk = smem + (threadIdx.x / 32) * 2 * d.head_dim;
  float* sv = sk + d.head_dim;
  const std::size_t total = d.batch * d.heads * d.seq;
  for (std::size_t w = detail::warp_start(); w < total; w += detail::warp_step()) {
    const std::size_t j = w % d.seq, bh = w / d.seq, h = bh % d.heads, b = bh / d.heads;
    const float* vj = v + at(d, b, j, h);
    for (std::size_t c = lane; c < d.head_dim; c += 32) sk[c] = sv[c] = 0.0f;
    for (std::size_t i = j; i < d.seq; ++i) {
      const float* doi = dout + at(d, b, i, h);
      const float* qi = q + at(d, b, i, h);
      const float a = att[(bh * d.seq + i) * d.seq + j];
      const float ds = a * (warp_dot(doi, vj, d.head_dim, lane) - dq[at(d, b, i, h)]) * scale;
      for (std::size_t c = lane; c < d.head_dim; c += 32) {
        sv[c] += a * doi[c];
        sk[c] += ds * qi[c];
      }
    }
    float* dkj = dk + at(d, b, j, h);
    float* dvj = dv + at(d, b, j, h);
    for (std::size_t c = lane; c < d.head_dim; c += 32) {
      dkj[c] = sk[c];
      dvj[c] = sv[c];
    }
  }
}

// 3. dq_i, a warp per query row, the sum over j <= i in order in shared memory (head_dim floats
// per warp). Every lane reads the parked D_i before any lane overwrites it.
__global__ void attention_backward_dq_kernel(const float* dout, const float* k, const float* v,
                                             const float* att, float* dq, Dims d, float scale) {
  extern __shared__ float smem[];
  const unsigned lane = threadIdx.x % 32;
  float* sq = smem + (threadIdx.x / 32) * d.head_dim;
  const std::size_t ld = d.heads * d.head_dim;
  const std::size_t total = d.batch * d.heads * d.seq;
  for (std::size_t w = detail::warp_start(); w < total; w += detail::warp_step()) {
    const std::size_t i = w % d.seq, bh = w / d.seq, h = bh % d.heads, b = bh / d.heads;
    float* dqi = dq + at(d, b, i, h);
    const float di = dqi[0];
    __syncwarp();
    const float* doi = dout + at(d, b, i, h);
    const float* kb = k + at(d, b, 0, h);
    const float* vb = v + at(d, b, 0, h);
    const float* a = att + w * d.seq;
    for (std::size_t c = lane; c < d.head_dim; c += 32) sq[c] = 0.0f;
    for (std::size_t j = 0; j <= i; ++j) {
      const float ds = a[j] * (warp_dot(doi, vb + j * ld, d.head_dim, lane) - di) * scale;
      for (std::size_t c = lane; c < d.head_dim; c += 32) sq[c] += ds * kb[j * ld + c];
    }
    for (std::size_t c = lane; c < d.head_dim; c += 32) dqi[c] = sq[c];
  }
}

// Dynamic shared memory of `bytes` for `kernel`, asking for more than the default 48 KiB only
// when a large head_dim needs it.
template <typename Kernel>
void allow_shared(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024) {
    DDP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(bytes)));
  }
}

}  // namespace

void attention_forward(const float* q, const float* k, const float* v, float* att, float* out,
                       std::size_t batch, std::size_t seq, std::size_t heads, std::size_t head_dim,
                       Stream stream) {
  if (batch * seq * heads * head_dim == 0) return;
  const Dims d{batch, seq, heads, head_dim};
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  attention_forward_kernel<<<detail::blocks_for(batch * heads * seq, detail::kThreads / 32),
                             detail::kThreads, 0, stream>>>(q, k, v, att, out, d, scale);
  DDP_CUDA_CHECK_LAUNCH("attention_forward");
}

void attention_backward(const float* dout, const float* q, const float* k, const float* v,
                        const float* att, float* dq, float* dk, float* dv, std::size_t batch,
                        std::size_t seq, std::size_t heads, std::size_t head_dim, Stream stream) {
  if (batch * seq * heads * head_dim == 0) return;
  const Dims d{batch, seq, heads, head_dim};
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  const std::size_t rows = batch * heads * seq;  // warps in each kernel
  attention_backward_d_kernel<<<detail::blocks_for(rows, detail::kThreads / 32), detail::kThreads,
                                0, stream>>>(dout, v, att, dq, d);
  DDP_CUDA_CHECK_LAUNCH("attention_backward (D)");

  const std::size_t dkdv_bytes = kWarps * 2 * head_dim * sizeof(float);
  allow_shared(attention_backward_dkdv_kernel, dkdv_bytes);
  attention_backward_dkdv_kernel<<<detail::blocks_for(rows, kWarps), kWarps * 32, dkdv_bytes,
                                   stream>>>(dout, q, v, att, dq, dk, dv, d, scale);
  DDP_CUDA_CHECK_LAUNCH("attention_backward (dk, dv)");

  const std::size_t dq_bytes = kWarps * head_dim * sizeof(float);
  allow_shared(attention_backward_dq_kernel, dq_bytes);
  attention_backward_dq_kernel<<<detail::blocks_for(rows, kWarps), kWarps * 32, dq_bytes, stream>>>(
      dout, k, v, att, dq, d, scale);
  DDP_CUDA_CHECK_LAUNCH("attention_backward (dq)");
}

}  // namespace ddp::kernels::cuda
