// The guard's switch reader: registration with the extension's Python module (defined in
// switches.cpp).
#pragma once

#include <torch/extension.h>

namespace pytest_backends {

void register_switches(pybind11::module_& m);

}  // namespace pytest_backends
