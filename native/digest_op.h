// Host-side pieces of the digest op shared by the CPU and CUDA kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/MaybeOwned.h>

#include <cstdint>
#include <string>

namespace pytest_backends {

struct PreparedTensor {
  // Contiguous, conj/neg bits resolved, same device: the tensor itself (borrowed)
  // unless a copy was needed.
  c10::MaybeOwned<at::Tensor> data;
  int64_t nbytes;        // bytes of data in logical order
  uint64_t header[2];    // per-lane header hash (dtype, shape, nbytes)
};

// Validates t and lays its bits out contiguously; defined in digest.cpp.
PreparedTensor prepare(const at::Tensor& t);

// The digest of a CPU tensor, computed on the calling thread's pool without
// allocating an output tensor; defined in digest.cpp.
void digest_host(const at::Tensor& t, uint64_t out[2]);

// The CPU kernel's instruction-set path: "avx512", "avx2" or "scalar".
std::string digest_isa();

// Selects the CPU kernel's path: the best the CPU supports at or below `wanted`
// ("auto": the best there is). Returns the path taken.
std::string set_digest_isa(const std::string& wanted);

// The per-lane final step: mix the header hash with the data sum.
uint64_t finalize(int lane, uint64_t header, uint64_t data);

}  // namespace pytest_backends
