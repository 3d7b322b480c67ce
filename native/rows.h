// The batch check's row comparison: registration with the extension's Python module
// (defined in rows.cpp).
#pragma once

#include <torch/extension.h>

namespace pytest_backends {

void register_rows(pybind11::module_& m);

}  // namespace pytest_backends
