// The digest op: schema, CPU and Meta kernels.
#include "digest.h"
#include "digest_op.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>

namespace pytest_backends {
namespace {

// Words per parallel_for grain: below this a tensor is digested on one thread.
constexpr int64_t kGrainWords = 1 << 15;

// Both lanes' header hashes, in one pass over the shape.
void header_hash(const at::Tensor& t, int64_t nbytes, uint64_t out[2]) {
  uint64_t h0 = kSeed0;
  uint64_t h1 = kSeed1;
  auto chain = [&](uint64_t w) {
    h0 = mix0(h0 ^ w);
    h1 = mix1(h1 ^ w);
  };
  chain(kFormatVersion);
  // c10::ScalarType values are append-only, hence stable across releases.
  chain(static_cast<uint64_t>(t.scalar_type()));
  chain(static_cast<uint64_t>(t.dim()));
  for (int64_t s : t.sizes()) {
    chain(static_cast<uint64_t>(s));
  }
  chain(static_cast<uint64_t>(nbytes));
  out[0] = h0;
  out[1] = h1;
}

// Sums the terms of whole words [begin, end). Built for several ISA levels so
// the 64-bit multiplies vectorise (AVX-512DQ has vpmullq) wherever available.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void sum_words(const uint8_t* p, int64_t begin, int64_t end, uint64_t* s0_out,
               uint64_t* s1_out) {
  uint64_t s0 = 0;
  uint64_t s1 = 0;
  for (int64_t i = begin; i < end; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    const uint64_t idx = static_cast<uint64_t>(i);
    s0 += term0(idx, w);
    s1 += term1(idx, w);
  }
  *s0_out = s0;
  *s1_out = s1;
}

void digest_host_impl(const at::Tensor& t, uint64_t out[2]) {
  const PreparedTensor prep = prepare(t);
  const auto* p = static_cast<const uint8_t*>(prep.data->const_data_ptr());
  const int64_t full = prep.nbytes / 8;
  std::atomic<uint64_t> acc0{0};
  std::atomic<uint64_t> acc1{0};
  if (full > 0 && full <= kGrainWords) {
    // One grain: no parallel region to enter (most op outputs of a small-op test).
    uint64_t s0 = 0;
    uint64_t s1 = 0;
    sum_words(p, 0, full, &s0, &s1);
    acc0.store(s0, std::memory_order_relaxed);
    acc1.store(s1, std::memory_order_relaxed);
  } else if (full > 0) {
    // Wrapping addition is commutative, so the split does not change the sum.
    at::parallel_for(0, full, kGrainWords, [&](int64_t begin, int64_t end) {
      uint64_t s0 = 0;
      uint64_t s1 = 0;
      sum_words(p, begin, end, &s0, &s1);
      acc0.fetch_add(s0, std::memory_order_relaxed);
      acc1.fetch_add(s1, std::memory_order_relaxed);
    });
  }
  uint64_t d0 = acc0.load();
  uint64_t d1 = acc1.load();
  const int64_t rest = prep.nbytes - 8 * full;
  if (rest > 0) {
    uint64_t w = 0;  // zero padding, little-endian like the full words
    std::memcpy(&w, p + 8 * full, static_cast<size_t>(rest));
    d0 += term0(static_cast<uint64_t>(full), w);
    d1 += term1(static_cast<uint64_t>(full), w);
  }
  out[0] = finalize(0, prep.header[0], d0);
  out[1] = finalize(1, prep.header[1], d1);
}

at::Tensor digest_cpu(const at::Tensor& t) {
  uint64_t d[2];
  digest_host(t, d);
  at::Tensor out = at::empty({2}, t.options().dtype(at::kLong));
  auto* o = out.data_ptr<int64_t>();
  o[0] = static_cast<int64_t>(d[0]);
  o[1] = static_cast<int64_t>(d[1]);
  return out;
}

at::Tensor digest_meta(const at::Tensor& t) {
  return at::empty({2}, t.options().dtype(at::kLong));
}

}  // namespace

PreparedTensor prepare(const at::Tensor& t) {
  TORCH_CHECK(t.defined(), "pytest_backends::digest: undefined tensor");
  TORCH_CHECK(t.layout() == at::kStrided,
              "pytest_backends::digest: only strided tensors are supported, got ",
              t.layout());
  TORCH_CHECK(!t.is_quantized(),
              "pytest_backends::digest: quantized tensors are not supported (digest t.int_repr())");
  PreparedTensor prep;
  // The common case (contiguous, no lazy conj/neg bit) needs no op call at all.
  if (t.is_conj() || t.is_neg() || !t.is_contiguous()) {
    prep.data = c10::MaybeOwned<at::Tensor>::owned(t.resolve_conj().resolve_neg().contiguous());
  } else {
    prep.data = c10::MaybeOwned<at::Tensor>::borrowed(t);
  }
  prep.nbytes = prep.data->numel() * static_cast<int64_t>(prep.data->element_size());
  header_hash(t, prep.nbytes, prep.header);
  return prep;
}

void digest_host(const at::Tensor& t, uint64_t out[2]) { digest_host_impl(t, out); }

uint64_t finalize(int lane, uint64_t header, uint64_t data) {
  return lane == 0 ? mix0(header ^ data) : mix1(header ^ data);
}

}  // namespace pytest_backends

TORCH_LIBRARY(pytest_backends, m) {
  m.def("digest(Tensor t) -> Tensor");
}

TORCH_LIBRARY_IMPL(pytest_backends, CPU, m) {
  m.impl("digest", &pytest_backends::digest_cpu);
}

TORCH_LIBRARY_IMPL(pytest_backends, Meta, m) {
  m.impl("digest", &pytest_backends::digest_meta);
}
