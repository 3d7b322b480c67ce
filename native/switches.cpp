// Torch's C++ switches read in one call, for the leak guard's fingerprint.
//
// The guard reads every switch twice per test. Through Python that is one binding call per
// switch (about ninety here), and between tests, with pytest's own code in the caches, those
// calls cost several times what they cost in a loop. Here they are read straight from ATen's
// context and thread-local states into one bytes object: a key, equal whenever every switch
// it covers is equal. The Python side keeps the rows' own values per key, read through the
// rows' getters when a key is first seen; the suite flips every covered row and checks that
// the key follows (tests/unit/test_native_switches.py).
//
// A switch kept in a static variable of an inline function in torch's headers (oneDNN
// Graph's `getLlgaEnabled`) is not read here: this library would read its own copy.
//
// Only the torch versions that test ran against are covered: another version reads no
// switch here (`switch_names()` is empty) and the guard reads each row through Python.
#include "switches.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <c10/core/AutogradState.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>
#include <ATen/functorch/BatchedFallback.h>
#include <torch/csrc/autograd/anomaly_mode.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/codegen/fuser/interface.h>
#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/passes/tensorexpr_fuser.h>
#include <torch/csrc/jit/python/update_graph_executor_opt.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/tensorexpr/kernel.h>

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#elif __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 13 && \
    TORCH_VERSION_MINOR <= 14
#define PYTEST_BACKENDS_SWITCHES 1
#endif

namespace pytest_backends {
namespace {

namespace py = pybind11;

#ifdef PYTEST_BACKENDS_SWITCHES

using Reader = std::function<int32_t()>;

int32_t optional_int(std::optional<int32_t> value) {
  return value.has_value() ? *value : INT32_MIN;
}

int32_t optional_bool(std::optional<bool> value) {
  return value.has_value() ? static_cast<int32_t>(*value) : -1;
}

// A getter that throws (an autocast device this build does not know) reads as a value no
// switch takes: the key stays a function of the switches.
int32_t guarded(const Reader& read) {
  try {
    return read();
  } catch (...) {
    return INT32_MIN + 1;
  }
}

int32_t precision(at::Float32Backend backend, at::Float32Op op) {
  return static_cast<int32_t>(at::globalContext().float32Precision(backend, op));
}

const std::vector<std::pair<std::string, Reader>>& readers() {
  static const std::vector<std::pair<std::string, Reader>> table = [] {
    using B = at::Float32Backend;
    using O = at::Float32Op;
    auto& ctx = at::globalContext();
    std::vector<std::pair<std::string, Reader>> t = {
        {"autograd.inference_mode", [] { return int32_t(c10::InferenceMode::is_enabled()); }},
        {"fp32_precision", [] { return precision(B::GENERIC, O::ALL); }},
        {"cudnn.fp32_precision", [] { return precision(B::CUDA, O::ALL); }},
        {"mkldnn.fp32_precision", [] { return precision(B::MKLDNN, O::ALL); }},
        {"cuda.matmul.fp32_precision", [] { return precision(B::CUDA, O::MATMUL); }},
        {"cudnn.conv.fp32_precision", [] { return precision(B::CUDA, O::CONV); }},
        {"cudnn.rnn.fp32_precision", [] { return precision(B::CUDA, O::RNN); }},
        {"mkldnn.matmul.fp32_precision", [] { return precision(B::MKLDNN, O::MATMUL); }},
        {"mkldnn.conv.fp32_precision", [] { return precision(B::MKLDNN, O::CONV); }},
        {"mkldnn.rnn.fp32_precision", [] { return precision(B::MKLDNN, O::RNN); }},
        {"cudnn.enabled", [&ctx] { return int32_t(ctx.userEnabledCuDNN()); }},
        {"cudnn.benchmark", [&ctx] { return int32_t(ctx.benchmarkCuDNN()); }},
        {"cudnn.deterministic", [&ctx] { return int32_t(ctx.deterministicCuDNN()); }},
        {"cudnn.depthwise_kernel", [&ctx] { return int32_t(ctx.cudnnDepthwiseKernel()); }},
        {"mkldnn.enabled", [&ctx] { return int32_t(ctx.userEnabledMkldnn()); }},
        {"mkldnn.deterministic", [&ctx] { return int32_t(ctx.deterministicMkldnn()); }},
        {"cuda.matmul.allow_fp16_reduced_precision_reduction",
         [&ctx] { return int32_t(ctx.allowFP16ReductionCuBLAS()); }},
        {"cuda.matmul.allow_bf16_reduced_precision_reduction",
         [&ctx] { return int32_t(ctx.allowBF16ReductionCuBLAS()); }},
        {"cuda.matmul.allow_fp16_accumulation",
         [&ctx] { return int32_t(ctx.allowFP16AccumulationCuBLAS()); }},
        {"cpu.allow_fp16_reduced_precision_reduction",
         [&ctx] { return int32_t(ctx.allowFP16ReductionCPU()); }},
        {"sdp.flash", [&ctx] { return int32_t(ctx.userEnabledFlashSDP()); }},
        {"sdp.mem_efficient", [&ctx] { return int32_t(ctx.userEnabledMemEfficientSDP()); }},
        {"sdp.math", [&ctx] { return int32_t(ctx.userEnabledMathSDP()); }},
        {"sdp.cudnn", [&ctx] { return int32_t(ctx.userEnabledCuDNNSDP()); }},
        {"sdp.fa3", [&ctx] { return int32_t(ctx.userEnabledFA3SDP()); }},
        {"sdp.overrideable", [&ctx] { return int32_t(ctx.userEnabledOverrideableSDP()); }},
        {"sdp.priority_order",
         [&ctx] {
           // the order packed in base num_sdp_backends + 1, first backend most significant
           int32_t packed = 0;
           for (auto backend : ctx.sDPPriorityOrder()) {
             packed = packed * (at::num_sdp_backends + 2) + (static_cast<int32_t>(backend) + 1);
           }
           return packed;
         }},
        {"sdp.allow_fp16_bf16_reduction_math",
         [&ctx] { return int32_t(ctx.allowFP16BF16ReductionMathSDP()); }},
        {"cuda.preferred_linalg_library",
         [&ctx] { return int32_t(ctx.linalgPreferredBackend()); }},
        {"cuda.preferred_blas_library", [&ctx] { return int32_t(ctx.blasPreferredBackend()); }},
        {"cuda.preferred_rocm_fa_library",
         [&ctx] { return int32_t(ctx.getROCmFAPreferredBackend()); }},
        {"nnpack.enabled", [&ctx] { return int32_t(ctx.userEnabledNNPACK()); }},
        {"quantized.engine", [&ctx] { return int32_t(ctx.qEngine()); }},
        {"deterministic_algorithms", [&ctx] { return int32_t(ctx.deterministicAlgorithms()); }},
        {"deterministic_algorithms.warn_only",
         [&ctx] { return int32_t(ctx.deterministicAlgorithmsWarnOnly()); }},
        {"deterministic.fill_uninitialized_memory",
         [&ctx] { return int32_t(ctx.deterministicFillUninitializedMemory()); }},
        {"default_dtype", [] { return int32_t(c10::get_default_dtype_as_scalartype()); }},
        {"num_threads", [] { return int32_t(at::get_num_threads()); }},
        {"autograd.grad_enabled", [] { return int32_t(c10::GradMode::is_enabled()); }},
        {"autograd.anomaly_enabled",
         [] { return int32_t(torch::autograd::AnomalyMode::is_enabled()); }},
        {"autograd.anomaly_check_nan",
         [] { return int32_t(torch::autograd::AnomalyMode::should_check_nan()); }},
        {"warn_always", [] { return int32_t(c10::WarningUtils::get_warnAlways()); }},
        {"autograd.fwd_grad_enabled",
         [] { return int32_t(c10::AutogradState::get_tls_state().get_fw_grad_mode()); }},
        {"autograd.multithreading_enabled",
         [] { return int32_t(c10::AutogradState::get_tls_state().get_multithreading_enabled()); }},
        {"autograd.view_replay_enabled",
         [] { return int32_t(c10::AutogradState::get_tls_state().get_view_replay_enabled()); }},
        {"sm_carveout", [&ctx] { return optional_int(ctx._SMCarveout_EXPERIMENTAL()); }},
        {"sparse.check_invariants",
         [&ctx] { return optional_bool(ctx.checkSparseTensorInvariants()); }},
        {"miopen.immediate", [&ctx] { return int32_t(ctx.immediateMiopen()); }},
        {"autograd.warn_on_accumulate_grad_stream_mismatch",
         [&ctx] { return int32_t(ctx.warnOnAccumulateGradStreamMismatch()); }},
        {"autograd.override_stale_capture_stream",
         [&ctx] { return int32_t(ctx.overrideStaleCaptureStream()); }},
        {"autocast.cache_enabled", [] { return int32_t(at::autocast::is_autocast_cache_enabled()); }},
        {"functorch.vmap_fallback_enabled", [] { return int32_t(at::functorch::isVmapFallbackEnabled()); }},
        {"autograd.fallback_mode",
         [] { return int32_t(torch::autograd::getAutogradFallbackMode()); }},
        {"jit.profiling_executor", [] { return int32_t(torch::jit::getExecutorMode().load()); }},
        {"jit.profiling_mode", [] { return int32_t(torch::jit::getProfilingMode().load()); }},
        {"jit.texpr_fuser", [] { return int32_t(torch::jit::tensorExprFuserEnabled()); }},
        {"jit.can_fuse_on_cpu", [] { return int32_t(torch::jit::canFuseOnCPU()); }},
        {"jit.graph_executor_optimize", [] { return int32_t(torch::jit::getGraphExecutorOptimize()); }},
        {"jit.texpr_reductions", [] { return int32_t(torch::jit::texprReductionsEnabled()); }},
        {"jit.texpr_dynamic_shape",
         [] { return int32_t(torch::jit::tensorExprDynamicShapeFusionEnabled()); }},
        {"jit.num_profiled_runs", [] { return int32_t(torch::jit::getNumProfiledRuns().load()); }},
        {"jit.inline_everything_mode", [] { return int32_t(torch::jit::getInlineEverythingMode()); }},
        {"jit.tracer_state_warn",
         [] { return int32_t(torch::jit::tracer::getTracerStateWarnMode().load()); }},
        {"jit.te_must_use_llvm_cpu",
         [] { return int32_t(torch::jit::tensorexpr::getTEMustUseLLVMOnCPU()); }},
        {"jit.te_generate_block_code",
         [] { return int32_t(torch::jit::tensorexpr::getTEGenerateBlockCode()); }},
        {"jit.te_cuda_pointwise_loop_levels",
         [] { return int32_t(torch::jit::tensorexpr::getTECudaPointwiseLoopLevels()); }},
        {"jit.te_cuda_pointwise_block_count",
         [] { return int32_t(torch::jit::tensorexpr::getTECudaPointwiseBlockCount()); }},
        {"jit.te_cuda_pointwise_block_size",
         [] { return int32_t(torch::jit::tensorexpr::getTECudaPointwiseBlockSize()); }},
    };
    const std::pair<const char*, c10::DeviceType> devices[] = {
        {"cpu", c10::DeviceType::CPU},   {"cuda", c10::DeviceType::CUDA},
        {"xpu", c10::DeviceType::XPU},   {"mps", c10::DeviceType::MPS},
        {"xla", c10::DeviceType::XLA},   {"ipu", c10::DeviceType::IPU},
        {"hpu", c10::DeviceType::HPU},   {"mtia", c10::DeviceType::MTIA},
        {"maia", c10::DeviceType::MAIA}, {"privateuseone", c10::DeviceType::PrivateUse1},
    };
    for (const auto& [name, device] : devices) {
      const auto type = device;
      t.emplace_back(std::string("autocast.") + name + ".enabled", [type] {
        return guarded([type] { return int32_t(at::autocast::is_autocast_enabled(type)); });
      });
      t.emplace_back(std::string("autocast.") + name + ".dtype", [type] {
        return guarded([type] { return int32_t(at::autocast::get_autocast_dtype(type)); });
      });
    }
    return t;
  }();
  return table;
}

py::bytes read_switches() {
  const auto& table = readers();
  std::vector<int32_t> values;
  values.reserve(table.size());
  for (const auto& entry : table) {
    values.push_back(entry.second());
  }
  return py::bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int32_t));
}

std::vector<std::string> switch_names() {
  std::vector<std::string> names;
  for (const auto& entry : readers()) {
    names.push_back(entry.first);
  }
  return names;
}

#else

py::bytes read_switches() { return py::bytes(""); }

std::vector<std::string> switch_names() { return {}; }

#endif

// The sum of the 64-bit words at ``offset`` in each object of ``objects``: the dicts' version
// tags, at the offset pytest_backends.flags.module_attributes proved, read without making a
// Python int per tag (the guard reads them twice per test). The caller holds the objects.
uint64_t version_sum(const py::tuple& objects, py::ssize_t offset) {
  uint64_t sum = 0;
  for (const py::handle object : objects) {
    uint64_t word = 0;
    std::memcpy(&word, reinterpret_cast<const char*>(object.ptr()) + offset, sizeof(word));
    sum += word;
  }
  return sum;
}

}  // namespace

void register_switches(py::module_& m) {
  m.def("version_sum", &version_sum, py::arg("objects"), py::arg("offset"),
        "The sum of the 64-bit words at byte ``offset`` in each object (dict version tags).");
  m.def("read_switches", &read_switches,
        "Every switch of switch_names(), packed: equal bytes when every switch is equal.");
  m.def("switch_names", &switch_names,
        "The guard's row names read_switches() covers, in its order (none on another torch).");
}

}  // namespace pytest_backends
