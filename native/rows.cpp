// The batch check's row comparison in one call: which rows of two tensors differ
// bitwise, and, for those, the max abs and rel difference. Between a model's calls
// every Python and NumPy call costs several times what it costs alone, and the
// pure-Python comparison makes about twenty-five of them.
//
// The figures are those of pytest_backends.batch.rows._numpy_figures, op for op in
// float64: diff = |got - ref| (a NaN on one side only, or inf - inf, counts as inf;
// NaN on both sides as 0), rel = diff / |ref| where |ref| > 0 and diff elsewhere, and
// a row's figure is the max over its elements, NaN if any element's is NaN (NumPy's
// max propagates NaN).
#include "rows.h"

#include <c10/util/Half.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace pytest_backends {
namespace {

namespace py = pybind11;

template <typename T>
void figures(const T* got, const T* ref, int64_t count, double& abs_max, double& rel_max) {
  const double inf = std::numeric_limits<double>::infinity();
  bool abs_nan = false;
  bool rel_nan = false;
  double a_max = -inf;
  double r_max = -inf;
  for (int64_t i = 0; i < count; ++i) {
    const double x = static_cast<double>(got[i]);
    const double y = static_cast<double>(ref[i]);
    double diff = std::fabs(x - y);
    if (std::isnan(diff)) {
      diff = (std::isnan(x) && std::isnan(y)) ? 0.0 : inf;
    }
    const double scale = std::fabs(y);
    const double rel = scale > 0 ? diff / scale : diff;
    abs_nan = abs_nan || std::isnan(diff);
    rel_nan = rel_nan || std::isnan(rel);
    a_max = diff > a_max ? diff : a_max;
    r_max = rel > r_max ? rel : r_max;
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  abs_max = abs_nan ? nan : a_max;
  rel_max = rel_nan ? nan : r_max;
}

// None when `got` and `ref` are bitwise equal; otherwise (differ, abs, rel), one entry per
// row along dimension 0 (0.0 for an identical row). Both must be dense CPU tensors of one
// shape and floating dtype (float16, float32, float64: the dtypes NumPy reads) with at least one row.
py::object compare_rows(const at::Tensor& ref, const at::Tensor& got) {
  TORCH_CHECK(ref.device().is_cpu() && got.device().is_cpu(), "compare_rows: CPU tensors only");
  TORCH_CHECK(ref.sizes().equals(got.sizes()) && ref.scalar_type() == got.scalar_type(),
              "compare_rows: the tensors differ in shape or dtype");
  TORCH_CHECK(ref.dim() >= 1 && ref.size(0) > 0, "compare_rows: no rows");
  TORCH_CHECK(ref.is_contiguous() && got.is_contiguous(), "compare_rows: contiguous tensors only");
  const int64_t n = ref.size(0);
  const int64_t per_row = ref.numel() / n;
  const size_t row_bytes = static_cast<size_t>(per_row) * ref.element_size();
  const auto* a = static_cast<const char*>(got.const_data_ptr());
  const auto* b = static_cast<const char*>(ref.const_data_ptr());
  if (per_row == 0 || std::memcmp(a, b, row_bytes * n) == 0) {
    return py::none();
  }
  py::list differ(n);
  py::list abs_rows(n);
  py::list rel_rows(n);
  for (int64_t r = 0; r < n; ++r) {
    const char* ga = a + r * row_bytes;
    const char* rb = b + r * row_bytes;
    double abs_max = 0.0;
    double rel_max = 0.0;
    const bool differs = std::memcmp(ga, rb, row_bytes) != 0;
    if (differs) {
      switch (ref.scalar_type()) {
        case at::kFloat:
          figures(reinterpret_cast<const float*>(ga), reinterpret_cast<const float*>(rb), per_row,
                  abs_max, rel_max);
          break;
        case at::kDouble:
          figures(reinterpret_cast<const double*>(ga), reinterpret_cast<const double*>(rb),
                  per_row, abs_max, rel_max);
          break;
        case at::kHalf:
          figures(reinterpret_cast<const c10::Half*>(ga), reinterpret_cast<const c10::Half*>(rb),
                  per_row, abs_max, rel_max);
          break;
        default:
          TORCH_CHECK(false, "compare_rows: unsupported dtype ", ref.scalar_type());
      }
    }
    differ[r] = py::bool_(differs);
    abs_rows[r] = py::float_(abs_max);
    rel_rows[r] = py::float_(rel_max);
  }
  return py::make_tuple(differ, abs_rows, rel_rows);
}

}  // namespace

void register_rows(py::module_& m) {
  m.def("compare_rows", &compare_rows, py::arg("ref"), py::arg("got"),
        "Rows of `got` against `ref` along dimension 0: None when bitwise equal, else "
        "(differ, max abs, max rel) per row, as the batch check's NumPy figures.");
}

}  // namespace pytest_backends
