// The digest algorithm, shared by the CPU and CUDA kernels.
//
// Mirrors pytest_backends/determinism/digest.py exactly (the torch-ops
// fallback computes the same values). Per lane L: the tensor's bytes in
// logical order, zero-padded to whole 64-bit little-endian words w[i], give
//   x_i    = w[i] ^ (i * K_L + S_L)
//   data_L = sum_i (r_L(x_i) + lo32(x_i) * hi32(x_i))   (mod 2^64)
// with r_0(x) = x and r_1(x) = x with its 32-bit halves swapped, and the
// digest lane is mix_L(header_L ^ data_L), where header_L chains mix_L over
// (version, dtype code, ndim, sizes..., nbytes) starting from S_L.
// Each term needs one 32x32->64 multiply (vpmuludq on x86, mul.wide on CUDA),
// so a 32-byte block costs a handful of vector instructions.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PB_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PB_HOST_DEVICE inline
#endif

namespace pytest_backends {

constexpr uint64_t kFormatVersion = 2;

constexpr uint64_t kKey0 = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kSeed0 = 0x243F6A8885A308D3ULL;
constexpr uint64_t kKey1 = 0xD6E8FEB86659FD93ULL;
constexpr uint64_t kSeed1 = 0x13198A2E03707344ULL;

// MurmurHash3 fmix64.
PB_HOST_DEVICE uint64_t mix0(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDULL;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ULL;
  x ^= x >> 33;
  return x;
}

// Stafford's Mix13 (the SplitMix64 finalizer).
PB_HOST_DEVICE uint64_t mix1(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

// lo32(x) * hi32(x) as a full 64-bit product: the quadratic part of a term.
PB_HOST_DEVICE uint64_t half_product(uint64_t x) {
  return (x & 0xFFFFFFFFULL) * (x >> 32);
}

// The data terms of a keyed word x = w ^ (i * K_L + S_L).
PB_HOST_DEVICE uint64_t lane_term0(uint64_t x) { return x + half_product(x); }

PB_HOST_DEVICE uint64_t lane_term1(uint64_t x) {
  return ((x << 32) | (x >> 32)) + half_product(x);
}

PB_HOST_DEVICE uint64_t term0(uint64_t index, uint64_t word) {
  return lane_term0(word ^ (index * kKey0 + kSeed0));
}

PB_HOST_DEVICE uint64_t term1(uint64_t index, uint64_t word) {
  return lane_term1(word ^ (index * kKey1 + kSeed1));
}

}  // namespace pytest_backends
