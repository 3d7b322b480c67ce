// The digest op: schema, CPU and Meta kernels.
#include "digest.h"
#include "digest_op.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <iterator>
#include <cstdlib>
#include <cstring>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

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

// Sums the terms of whole words [begin, end) of p into s[0], s[1].
using SumWords = void (*)(const uint8_t* p, int64_t begin, int64_t end, uint64_t s[2]);

void sum_words_scalar(const uint8_t* p, int64_t begin, int64_t end, uint64_t s[2]) {
  uint64_t s0 = 0;
  uint64_t s1 = 0;
  uint64_t k0 = static_cast<uint64_t>(begin) * kKey0 + kSeed0;
  uint64_t k1 = static_cast<uint64_t>(begin) * kKey1 + kSeed1;
  for (int64_t i = begin; i < end; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    s0 += lane_term0(w ^ k0);
    s1 += lane_term1(w ^ k1);
    k0 += kKey0;
    k1 += kKey1;
  }
  s[0] = s0;
  s[1] = s1;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define PB_X86_DISPATCH 1

// Four independent accumulator pairs over 4 vectors of 4 words (128 bytes) per
// step: no per-element widening, one vpmuludq per lane and vector.
__attribute__((target("avx2"))) void sum_words_avx2(const uint8_t* p, int64_t begin,
                                                     int64_t end, uint64_t s[2]) {
  constexpr int64_t kVec = 4;     // words per vector
  constexpr int64_t kUnroll = 4;  // vectors per step
  int64_t i = begin;
  uint64_t t0 = 0;
  uint64_t t1 = 0;
  if (end - begin >= kVec * kUnroll) {
    __m256i a0[kUnroll];
    __m256i a1[kUnroll];
    __m256i k0[kUnroll];
    __m256i k1[kUnroll];
    for (int64_t u = 0; u < kUnroll; ++u) {
      const uint64_t first = static_cast<uint64_t>(begin + u * kVec);
      a0[u] = _mm256_setzero_si256();
      a1[u] = _mm256_setzero_si256();
      k0[u] = _mm256_set_epi64x(
          static_cast<int64_t>((first + 3) * kKey0 + kSeed0),
          static_cast<int64_t>((first + 2) * kKey0 + kSeed0),
          static_cast<int64_t>((first + 1) * kKey0 + kSeed0),
          static_cast<int64_t>(first * kKey0 + kSeed0));
      k1[u] = _mm256_set_epi64x(
          static_cast<int64_t>((first + 3) * kKey1 + kSeed1),
          static_cast<int64_t>((first + 2) * kKey1 + kSeed1),
          static_cast<int64_t>((first + 1) * kKey1 + kSeed1),
          static_cast<int64_t>(first * kKey1 + kSeed1));
    }
    const __m256i step0 = _mm256_set1_epi64x(static_cast<int64_t>(kVec * kUnroll * kKey0));
    const __m256i step1 = _mm256_set1_epi64x(static_cast<int64_t>(kVec * kUnroll * kKey1));
    for (; i + kVec * kUnroll <= end; i += kVec * kUnroll) {
      for (int64_t u = 0; u < kUnroll; ++u) {
        const __m256i w = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(p + 8 * (i + u * kVec)));
        const __m256i x0 = _mm256_xor_si256(w, k0[u]);
        const __m256i x1 = _mm256_xor_si256(w, k1[u]);
        // vpmuludq reads the low half of each word: the swapped word's low half is the
        // high half, so lane 1's swap is also its multiplier (one shift fewer)
        const __m256i r1 = _mm256_shuffle_epi32(x1, 0xB1);
        const __m256i m0 = _mm256_mul_epu32(x0, _mm256_srli_epi64(x0, 32));
        const __m256i m1 = _mm256_mul_epu32(x1, r1);
        a0[u] = _mm256_add_epi64(a0[u], _mm256_add_epi64(x0, m0));
        a1[u] = _mm256_add_epi64(a1[u], _mm256_add_epi64(r1, m1));
        k0[u] = _mm256_add_epi64(k0[u], step0);
        k1[u] = _mm256_add_epi64(k1[u], step1);
      }
    }
    const __m256i v0 = _mm256_add_epi64(_mm256_add_epi64(a0[0], a0[1]),
                                        _mm256_add_epi64(a0[2], a0[3]));
    const __m256i v1 = _mm256_add_epi64(_mm256_add_epi64(a1[0], a1[1]),
                                        _mm256_add_epi64(a1[2], a1[3]));
    alignas(32) uint64_t l0[kVec];
    alignas(32) uint64_t l1[kVec];
    _mm256_store_si256(reinterpret_cast<__m256i*>(l0), v0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(l1), v1);
    for (int64_t u = 0; u < kVec; ++u) {
      t0 += l0[u];
      t1 += l1[u];
    }
  }
  uint64_t rest[2];
  sum_words_scalar(p, i, end, rest);
  s[0] = t0 + rest[0];
  s[1] = t1 + rest[1];
}

// The AVX2 loop on 8-word vectors (AVX-512F has every instruction it needs).
__attribute__((target("avx512f"))) void sum_words_avx512(const uint8_t* p, int64_t begin,
                                                         int64_t end, uint64_t s[2]) {
  constexpr int64_t kVec = 8;
  constexpr int64_t kUnroll = 4;
  int64_t i = begin;
  uint64_t t0 = 0;
  uint64_t t1 = 0;
  if (end - begin >= kVec * kUnroll) {
    __m512i a0[kUnroll];
    __m512i a1[kUnroll];
    __m512i k0[kUnroll];
    __m512i k1[kUnroll];
    for (int64_t u = 0; u < kUnroll; ++u) {
      const uint64_t first = static_cast<uint64_t>(begin + u * kVec);
      a0[u] = _mm512_setzero_si512();
      a1[u] = _mm512_setzero_si512();
      alignas(64) uint64_t c0[kVec];
      alignas(64) uint64_t c1[kVec];
      for (int64_t j = 0; j < kVec; ++j) {
        c0[j] = (first + static_cast<uint64_t>(j)) * kKey0 + kSeed0;
        c1[j] = (first + static_cast<uint64_t>(j)) * kKey1 + kSeed1;
      }
      k0[u] = _mm512_load_si512(c0);
      k1[u] = _mm512_load_si512(c1);
    }
    const __m512i step0 = _mm512_set1_epi64(static_cast<int64_t>(kVec * kUnroll * kKey0));
    const __m512i step1 = _mm512_set1_epi64(static_cast<int64_t>(kVec * kUnroll * kKey1));
    for (; i + kVec * kUnroll <= end; i += kVec * kUnroll) {
      for (int64_t u = 0; u < kUnroll; ++u) {
        const __m512i w = _mm512_loadu_si512(p + 8 * (i + u * kVec));
        const __m512i x0 = _mm512_xor_si512(w, k0[u]);
        const __m512i x1 = _mm512_xor_si512(w, k1[u]);
        // as in the AVX2 loop: lane 1's swapped word is its multiplier; lane 0's high
        // halves come from a shuffle (port 5) rather than a shift (port 0, with the multiplies)
        const __m512i r1 = _mm512_shuffle_epi32(x1, _MM_PERM_CDAB);
        const __m512i m0 = _mm512_mul_epu32(x0, _mm512_shuffle_epi32(x0, _MM_PERM_CDAB));
        const __m512i m1 = _mm512_mul_epu32(x1, r1);
        a0[u] = _mm512_add_epi64(a0[u], _mm512_add_epi64(x0, m0));
        a1[u] = _mm512_add_epi64(a1[u], _mm512_add_epi64(r1, m1));
        k0[u] = _mm512_add_epi64(k0[u], step0);
        k1[u] = _mm512_add_epi64(k1[u], step1);
      }
    }
    const __m512i v0 = _mm512_add_epi64(_mm512_add_epi64(a0[0], a0[1]),
                                        _mm512_add_epi64(a0[2], a0[3]));
    const __m512i v1 = _mm512_add_epi64(_mm512_add_epi64(a1[0], a1[1]),
                                        _mm512_add_epi64(a1[2], a1[3]));
    alignas(64) uint64_t l0[kVec];
    alignas(64) uint64_t l1[kVec];
    _mm512_store_si512(l0, v0);
    _mm512_store_si512(l1, v1);
    for (int64_t u = 0; u < kVec; ++u) {
      t0 += l0[u];
      t1 += l1[u];
    }
  }
  uint64_t rest[2];
  sum_words_scalar(p, i, end, rest);
  s[0] = t0 + rest[0];
  s[1] = t1 + rest[1];
}
#endif

// The CPU's best path, or the one PYTEST_BACKENDS_DIGEST_ISA names (capped at
// what the CPU supports: a request is never trusted over the CPU's own flags).
struct IsaChoice {
  SumWords fn;
  const char* name;
};

bool isa_supported(const std::string& name) {
  if (name == "scalar") {
    return true;
  }
#if defined(PB_X86_DISPATCH)
  __builtin_cpu_init();
  if (name == "avx2") {
    return __builtin_cpu_supports("avx2");
  }
  if (name == "avx512") {
    return __builtin_cpu_supports("avx512f");
  }
#endif
  return false;
}

IsaChoice isa_by_name(const std::string& name) {
#if defined(PB_X86_DISPATCH)
  if (name == "avx512") {
    return {&sum_words_avx512, "avx512"};
  }
  if (name == "avx2") {
    return {&sum_words_avx2, "avx2"};
  }
#endif
  return {&sum_words_scalar, "scalar"};
}

// The best supported path at or below `wanted` ("auto": the best there is).
IsaChoice choose_isa(const std::string& wanted) {
  static const char* const kOrder[] = {"avx512", "avx2", "scalar"};
  // An unknown name (a typo in PYTEST_BACKENDS_DIGEST_ISA) counts as "auto".
  bool reached = std::find(std::begin(kOrder), std::end(kOrder), wanted) == std::end(kOrder);
  for (const char* name : kOrder) {
    reached = reached || wanted == name;
    if (reached && isa_supported(name)) {
      return isa_by_name(name);
    }
  }
  return isa_by_name("scalar");
}

std::atomic<SumWords> g_sum_words{nullptr};
std::atomic<const char*> g_isa_name{nullptr};

SumWords sum_words_fn() {
  SumWords fn = g_sum_words.load(std::memory_order_acquire);
  if (fn == nullptr) {
    const char* env = std::getenv("PYTEST_BACKENDS_DIGEST_ISA");
    const IsaChoice choice = choose_isa(env == nullptr ? "auto" : env);
    g_isa_name.store(choice.name, std::memory_order_release);
    g_sum_words.store(choice.fn, std::memory_order_release);
    fn = choice.fn;
  }
  return fn;
}

void digest_host_impl(const at::Tensor& t, uint64_t out[2]) {
  const PreparedTensor prep = prepare(t);
  const auto* p = static_cast<const uint8_t*>(prep.data->const_data_ptr());
  const int64_t full = prep.nbytes / 8;
  const SumWords sum_words = sum_words_fn();
  std::atomic<uint64_t> acc0{0};
  std::atomic<uint64_t> acc1{0};
  if (full > 0 && full <= kGrainWords) {
    // One grain: no parallel region to enter (most op outputs of a small-op test).
    uint64_t s[2];
    sum_words(p, 0, full, s);
    acc0.store(s[0], std::memory_order_relaxed);
    acc1.store(s[1], std::memory_order_relaxed);
  } else if (full > 0) {
    // Wrapping addition is commutative, so the split does not change the sum.
    at::parallel_for(0, full, kGrainWords, [&](int64_t begin, int64_t end) {
      uint64_t s[2];
      sum_words(p, begin, end, s);
      acc0.fetch_add(s[0], std::memory_order_relaxed);
      acc1.fetch_add(s[1], std::memory_order_relaxed);
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

std::string digest_isa() {
  sum_words_fn();
  return g_isa_name.load(std::memory_order_acquire);
}

std::string set_digest_isa(const std::string& wanted) {
  static const char* const kKnown[] = {"auto", "avx512", "avx2", "scalar"};
  bool known = false;
  for (const char* name : kKnown) {
    known = known || wanted == name;
  }
  TORCH_CHECK(known, "pytest_backends: unknown digest ISA '", wanted,
              "' (expected auto, avx512, avx2 or scalar)");
  const IsaChoice choice = choose_isa(wanted);
  g_isa_name.store(choice.name, std::memory_order_release);
  g_sum_words.store(choice.fn, std::memory_order_release);
  return choice.name;
}

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
