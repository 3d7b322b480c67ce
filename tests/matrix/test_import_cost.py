"""Loading the plugin and the matrix modules never imports torch."""

from __future__ import annotations

import subprocess
import sys


def test_matrix_modules_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "import pytest_backends.plugin, pytest_backends.hookspecs\n"
        "import pytest_backends.matrix.hooks, pytest_backends.matrix.report_plugin\n"
        "import pytest_backends.matrix.verify, pytest_backends.matrix.availability\n"
        "import pytest_backends.matrix.feature, pytest_backends.matrix.api\n"
        "import pytest_backends.matrix.markers, pytest_backends.matrix.configs\n"
        "import pytest_backends.matrix.xdist\n"
        "from pytest_backends.matrix.axes import builtin_registry\n"
        "builtin_registry().product({'mkldnn': ['on', 'off']})\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
