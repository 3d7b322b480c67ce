// The native repeat loop and the Python module entry point.
//
// repeat(name, overload, args, kwargs, runs, clone_mutated) binds the Python
// arguments to the op's schema once, then calls the op `runs` times through
// the dispatcher (callBoxed) and digests every output on its device, with the
// GIL released, so a repeat costs one dispatcher call plus one digest.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/extension.h>

#include "digest_op.h"
#include "recorder.h"
#include "rows.h"
#include "switches.h"

#if __has_include(<torch/headeronly/version.h>)
#include <torch/headeronly/version.h>
#elif __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

#include <string>
#include <vector>

namespace pytest_backends {
namespace {

at::Tensor call_digest(const at::Tensor& t) {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("pytest_backends::digest", "")
                             .typed<at::Tensor(const at::Tensor&)>();
  return op.call(t.detach());
}

// Appends the digests of an op output in the order digest.py's fallback uses:
// tensors in order, lists/tuples flattened, scalars as 0-dim CPU tensors,
// None and undefined tensors skipped.
void append_digests(const c10::IValue& v, std::vector<at::Tensor>& out) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (t.defined()) {
      out.push_back(call_digest(t));
    }
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorVector()) {
      if (t.defined()) {
        out.push_back(call_digest(t));
      }
    }
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toListRef()) {
      append_digests(e, out);
    }
  } else if (v.isTuple()) {
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      append_digests(e, out);
    }
  } else if (v.isNone()) {
  } else if (v.isBool()) {
    out.push_back(call_digest(at::scalar_tensor(v.toBool(), at::kBool)));
  } else if (v.isInt()) {
    out.push_back(call_digest(at::scalar_tensor(v.toInt(), at::kLong)));
  } else if (v.isDouble()) {
    out.push_back(call_digest(at::scalar_tensor(v.toDouble(), at::kDouble)));
  } else if (v.isComplexDouble()) {
    out.push_back(call_digest(at::scalar_tensor(v.toComplexDouble(), at::kComplexDouble)));
  } else {
    TORCH_CHECK(false, "repeat: cannot digest an op output of type ", v.tagKind());
  }
}

std::vector<at::Tensor> repeat(const std::string& name, const std::string& overload,
                               const py::tuple& args, const py::dict& kwargs, int64_t runs,
                               bool clone_mutated) {
  TORCH_CHECK(runs >= 1, "repeat: runs must be >= 1, got ", runs);
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(name.c_str(), overload.c_str());
  const c10::FunctionSchema& schema = op.schema();
  py::kwargs kw = py::reinterpret_borrow<py::kwargs>(kwargs);
  const torch::jit::Stack inputs =
      torch::jit::createStackForSchema(schema, args, kw, std::nullopt);

  std::vector<size_t> mutated;
  if (clone_mutated) {
    const auto& arguments = schema.arguments();
    for (size_t i = 0; i < arguments.size(); ++i) {
      const auto* alias = arguments[i].alias_info();
      if (alias != nullptr && alias->isWrite()) {
        mutated.push_back(i);
      }
    }
  }

  std::vector<at::Tensor> digests;
  size_t per_run = 0;
  {
    py::gil_scoped_release no_gil;
    for (int64_t r = 0; r < runs; ++r) {
      torch::jit::Stack stack = inputs;
      for (size_t i : mutated) {
        if (stack[i].isTensor() && stack[i].toTensor().defined()) {
          stack[i] = stack[i].toTensor().clone();
        }
      }
      op.callBoxed(stack);
      const size_t before = digests.size();
      for (const c10::IValue& v : stack) {
        append_digests(v, digests);
      }
      const size_t produced = digests.size() - before;
      if (r == 0) {
        per_run = produced;
        digests.reserve(per_run * static_cast<size_t>(runs));
      }
      TORCH_CHECK(produced == per_run, "repeat: run ", r, " produced ", produced,
                  " outputs, the first run ", per_run);
    }
  }
  return digests;
}

std::string torch_version() {
#if defined(TORCH_VERSION_MAJOR)
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
#else
  return "unknown";
#endif
}

}  // namespace
}  // namespace pytest_backends

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "pytest_backends native harness: digest op (torch.ops.pytest_backends) and repeat";
  m.def("repeat", &pytest_backends::repeat, py::arg("name"), py::arg("overload"),
        py::arg("args"), py::arg("kwargs"), py::arg("runs"), py::arg("clone_mutated") = true,
        "Call an op `runs` times through the dispatcher; digests of every output, flat.");
  m.def("torch_version", &pytest_backends::torch_version,
        "The torch version the extension was built against.");
  m.def("digest_isa", &pytest_backends::digest_isa,
        "The CPU digest kernel's instruction-set path: avx512, avx2 or scalar.");
  m.def("set_digest_isa", &pytest_backends::set_digest_isa, py::arg("wanted"),
        "Use the best CPU digest path at or below `wanted` (auto, avx512, avx2, scalar) "
        "that this CPU supports; returns the path taken.");
  pytest_backends::register_recorder(m);
  pytest_backends::register_rows(m);
  pytest_backends::register_switches(m);
}
