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
#include <torch/csrc/autograd/python_variable.h>

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

// The row figures of one differing row: dispatched on the dtype (float32, float64, float16).
void row_figures(at::ScalarType dtype, const char* got, const char* ref, int64_t count,
                 double& abs_max, double& rel_max) {
  switch (dtype) {
    case at::kFloat:
      figures(reinterpret_cast<const float*>(got), reinterpret_cast<const float*>(ref), count,
              abs_max, rel_max);
      break;
    case at::kDouble:
      figures(reinterpret_cast<const double*>(got), reinterpret_cast<const double*>(ref), count,
              abs_max, rel_max);
      break;
    default:
      figures(reinterpret_cast<const c10::Half*>(got), reinterpret_cast<const c10::Half*>(ref),
              count, abs_max, rel_max);
  }
}

// A plain dense CPU tensor whose elements are its bytes at its data pointer.
bool dense_cpu(const at::Tensor& t) {
  return t.device().is_cpu() && t.layout() == at::kStrided && !t.is_nested() &&
         t.is_contiguous() && !t.is_conj() && !t.is_neg() && !t._is_zerotensor();
}

// Python's max() over a list: the first item, replaced by each later item greater than it
// (a NaN is kept where it comes first and never taken later), as the Python comparison does.
inline void python_max(double value, bool first, double& current) {
  if (first || value > current) {
    current = value;
  }
}

// Every sub-batch of a check against the full batch's rows in one call. `cases` holds
// (first, rows, got): `got` has len(rows) rows, row j of it being row rows[j] of `ref`
// (first: rows[0] where the rows are consecutive, else None). Returns None where `ref` or
// any `got` is not a plain dense CPU tensor of one float dtype NumPy reads with the
// expected shape (the caller compares them otherwise); else, per case, None when its rows
// are bitwise equal, or (first differing row, rows differing, max abs, max rel) over its rows
// (0.0 for identical rows), as the Python comparison computes them.
py::object compare_cases(const at::Tensor& ref, const py::list& cases) {
  const at::ScalarType dtype = ref.scalar_type();
  if (!(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf) || !dense_cpu(ref) ||
      ref.dim() < 1 || ref.size(0) == 0 || ref.numel() == 0) {
    return py::none();
  }
  const int64_t n = ref.size(0);
  const int64_t per_row = ref.numel() / n;
  const size_t row_bytes = static_cast<size_t>(per_row) * ref.element_size();
  const auto* base = static_cast<const char*>(ref.const_data_ptr());
  const auto tail = ref.sizes().slice(1);
  std::vector<at::Tensor> gots;
  std::vector<std::vector<int64_t>> all_rows;
  gots.reserve(cases.size());
  all_rows.reserve(cases.size());
  for (const py::handle item : cases) {
    const auto entry = py::reinterpret_borrow<py::tuple>(item);
    PyObject* obj = entry[2].ptr();
    if (!THPVariable_CheckExact(obj)) {
      return py::none();
    }
    const at::Tensor& got = THPVariable_Unpack(obj);
    auto rows = entry[1].cast<std::vector<int64_t>>();
    // dense_cpu first: a nested tensor has no sizes to read
    if (got.scalar_type() != dtype || !dense_cpu(got) || got.dim() != ref.dim() ||
        got.size(0) != static_cast<int64_t>(rows.size()) || !got.sizes().slice(1).equals(tail)) {
      return py::none();
    }
    for (const int64_t r : rows) {
      TORCH_CHECK(r >= 0 && r < n, "compare_cases: row ", r, " is out of range");
    }
    gots.push_back(got);
    all_rows.push_back(std::move(rows));
  }
  py::list out(gots.size());
  for (size_t c = 0; c < gots.size(); ++c) {
    const auto* got = static_cast<const char*>(gots[c].const_data_ptr());
    const auto& rows = all_rows[c];
    const int64_t k = static_cast<int64_t>(rows.size());
    bool consecutive = true;
    for (int64_t j = 1; j < k && consecutive; ++j) {
      consecutive = rows[j] == rows[0] + j;
    }
    if (consecutive && std::memcmp(base + rows[0] * row_bytes, got, row_bytes * k) == 0) {
      out[c] = py::none();
      continue;
    }
    int64_t first_bad = -1;
    int64_t bad = 0;
    double abs_max = 0.0;
    double rel_max = 0.0;
    for (int64_t j = 0; j < k; ++j) {
      const char* g = got + j * row_bytes;
      const char* r = base + rows[j] * row_bytes;
      double row_abs = 0.0;
      double row_rel = 0.0;
      if (std::memcmp(g, r, row_bytes) != 0) {
        row_figures(dtype, g, r, per_row, row_abs, row_rel);
        if (first_bad < 0) {
          first_bad = rows[j];
        }
        ++bad;
      }
      python_max(row_abs, j == 0, abs_max);
      python_max(row_rel, j == 0, rel_max);
    }
    if (bad == 0) {
      out[c] = py::none();
    } else {
      out[c] = py::make_tuple(first_bad, bad, abs_max, rel_max);
    }
  }
  return out;
}

}  // namespace

void register_rows(py::module_& m) {
  m.def("compare_rows", &compare_rows, py::arg("ref"), py::arg("got"),
        "Rows of `got` against `ref` along dimension 0: None when bitwise equal, else "
        "(differ, max abs, max rel) per row, as the batch check's NumPy figures.");
  m.def("compare_cases", &compare_cases, py::arg("ref"), py::arg("cases"),
        "Every sub-batch (first, rows, got) against `ref`'s rows in one call: None where a "
        "tensor is not plain dense CPU float, else per case None (equal) or (first differing "
        "row, rows differing, max abs, max rel).");
}

}  // namespace pytest_backends
