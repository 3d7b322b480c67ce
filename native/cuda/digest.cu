// CUDA kernel of the digest op: the same algorithm as the CPU kernel
// (native/digest.h), computed on the device; only 16 bytes reach the host
// when the caller asks for them.
#include "digest.h"
#include "digest_op.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

namespace pytest_backends {
namespace {

constexpr int kThreads = 256;
// Tensors up to this many words are digested by one block in one launch.
constexpr int64_t kSingleBlockWords = 1 << 14;

// Word i of the byte stream, zero-padded past nbytes (little-endian).
__device__ __forceinline__ uint64_t load_word(const uint8_t* p, int64_t nbytes, int64_t i,
                                              bool aligned) {
  if (aligned && 8 * (i + 1) <= nbytes) {
    return __ldg(reinterpret_cast<const unsigned long long*>(p) + i);
  }
  uint64_t w = 0;
  for (int b = 0; b < 8; ++b) {
    const int64_t at = 8 * i + b;
    if (at < nbytes) {
      w |= static_cast<uint64_t>(p[at]) << (8 * b);
    }
  }
  return w;
}

__device__ __forceinline__ uint64_t warp_sum(uint64_t v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;
}

// Block-wide sum of both lanes; the result is valid in thread 0.
__device__ __forceinline__ void block_sum(uint64_t& s0, uint64_t& s1) {
  __shared__ uint64_t part0[kThreads / 32];
  __shared__ uint64_t part1[kThreads / 32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  s0 = warp_sum(s0);
  s1 = warp_sum(s1);
  if (lane == 0) {
    part0[warp] = s0;
    part1[warp] = s1;
  }
  __syncthreads();
  if (warp == 0) {
    s0 = lane < kThreads / 32 ? part0[lane] : 0;
    s1 = lane < kThreads / 32 ? part1[lane] : 0;
    s0 = warp_sum(s0);
    s1 = warp_sum(s1);
  }
}

__device__ __forceinline__ void thread_sums(const uint8_t* p, int64_t nbytes, int64_t nwords,
                                            uint64_t& s0, uint64_t& s1) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  const bool aligned8 = addr % 8 == 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Two words per 16-byte load while both are whole and aligned. The position
  // keys i * K + S advance by a constant per step, saving two multiplies.
  const int64_t pairs = addr % 16 == 0 ? nbytes / 16 : 0;
  const uint64_t step0 = 2 * static_cast<uint64_t>(stride) * kKey0;
  const uint64_t step1 = 2 * static_cast<uint64_t>(stride) * kKey1;
  uint64_t key0 = 2 * static_cast<uint64_t>(first) * kKey0 + kSeed0;
  uint64_t key1 = 2 * static_cast<uint64_t>(first) * kKey1 + kSeed1;
  const auto* pairs_p = reinterpret_cast<const ulonglong2*>(p);
  int64_t i = first;
  // Four loads in flight per thread before any is used: one load at a time
  // left the memory system idle between a thread's iterations.
  for (; i + 3 * stride < pairs; i += 4 * stride) {
    ulonglong2 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      v[k] = __ldg(pairs_p + i + k * stride);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s0 += lane_term0(v[k].x ^ key0) + lane_term0(v[k].y ^ (key0 + kKey0));
      s1 += lane_term1(v[k].x ^ key1) + lane_term1(v[k].y ^ (key1 + kKey1));
      key0 += step0;
      key1 += step1;
    }
  }
  for (; i < pairs; i += stride) {
    const ulonglong2 v = __ldg(pairs_p + i);
    s0 += lane_term0(v.x ^ key0) + lane_term0(v.y ^ (key0 + kKey0));
    s1 += lane_term1(v.x ^ key1) + lane_term1(v.y ^ (key1 + kKey1));
    key0 += step0;
    key1 += step1;
  }
  for (int64_t w = 2 * pairs + first; w < nwords; w += stride) {
    const uint64_t x = load_word(p, nbytes, w, aligned8);
    s0 += term0(static_cast<uint64_t>(w), x);
    s1 += term1(static_cast<uint64_t>(w), x);
  }
}

// Small tensors: one block sums and finalizes, writing the digest directly.
__global__ void __launch_bounds__(kThreads)
    digest_single_block(const uint8_t* p, int64_t nbytes, int64_t nwords, uint64_t h0,
                        uint64_t h1, int64_t* out) {
  uint64_t s0 = 0;
  uint64_t s1 = 0;
  thread_sums(p, nbytes, nwords, s0, s1);
  block_sum(s0, s1);
  if (threadIdx.x == 0) {
    out[0] = static_cast<int64_t>(mix0(h0 ^ s0));
    out[1] = static_cast<int64_t>(mix1(h1 ^ s1));
  }
}

// Large tensors: blocks add partial sums atomically. Wrapping addition is
// commutative, so the result does not depend on the order of the atomics. The
// last block to finish finalizes, so one launch does the whole digest.
__global__ void __launch_bounds__(kThreads)
    digest_grid(const uint8_t* p, int64_t nbytes, int64_t nwords, uint64_t h0, uint64_t h1,
                unsigned long long* scratch, int64_t* out) {
  uint64_t s0 = 0;
  uint64_t s1 = 0;
  thread_sums(p, nbytes, nwords, s0, s1);
  block_sum(s0, s1);
  if (threadIdx.x == 0) {
    atomicAdd(scratch, static_cast<unsigned long long>(s0));
    atomicAdd(scratch + 1, static_cast<unsigned long long>(s1));
    __threadfence();  // this block's sums are visible before it counts itself done
    const unsigned long long done = atomicAdd(scratch + 2, 1ULL);
    if (done == gridDim.x - 1) {
      const uint64_t t0 = atomicAdd(scratch, 0ULL);
      const uint64_t t1 = atomicAdd(scratch + 1, 0ULL);
      out[0] = static_cast<int64_t>(mix0(h0 ^ t0));
      out[1] = static_cast<int64_t>(mix1(h1 ^ t1));
    }
  }
}

at::Tensor digest_cuda(const at::Tensor& t) {
  const c10::cuda::CUDAGuard guard(t.device());
  const PreparedTensor prep = prepare(t);
  const auto* p = static_cast<const uint8_t*>(prep.data->const_data_ptr());
  const int64_t nbytes = prep.nbytes;
  const int64_t nwords = (nbytes + 7) / 8;
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  if (nwords <= kSingleBlockWords) {
    at::Tensor out = at::empty({2}, t.options().dtype(at::kLong));
    digest_single_block<<<1, kThreads, 0, stream>>>(p, nbytes, nwords, prep.header[0],
                                                     prep.header[1], out.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
  }
  at::Tensor out = at::empty({2}, t.options().dtype(at::kLong));
  // two sums and the count of finished blocks, zeroed without a kernel launch
  at::Tensor scratch = at::empty({3}, t.options().dtype(at::kLong));
  auto* acc = reinterpret_cast<unsigned long long*>(scratch.data_ptr<int64_t>());
  C10_CUDA_CHECK(cudaMemsetAsync(acc, 0, 3 * sizeof(int64_t), stream));
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, t.get_device()));
  const int64_t wanted = (nwords + 8 * kThreads - 1) / (8 * kThreads);
  const int blocks = static_cast<int>(std::min<int64_t>(wanted, static_cast<int64_t>(sms) * 8));
  digest_grid<<<blocks, kThreads, 0, stream>>>(p, nbytes, nwords, prep.header[0], prep.header[1],
                                               acc, out.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace
}  // namespace pytest_backends

TORCH_LIBRARY_IMPL(pytest_backends, CUDA, m) {
  m.impl("digest", &pytest_backends::digest_cuda);
}
