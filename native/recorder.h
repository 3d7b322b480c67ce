// The native op recorder of --backends-determinism: registration with the
// extension's Python module (defined in recorder.cpp).
#pragma once

#include <torch/extension.h>

namespace pytest_backends {

void register_recorder(pybind11::module_& m);

}  // namespace pytest_backends
