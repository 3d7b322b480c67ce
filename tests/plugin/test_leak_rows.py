"""Every piece of process-global state the guard restores: one test sets it, the next sees
the default.

Each pair runs in a real pytest session (``runpytest_subprocess``): the first test
changes the state through torch's own API and never restores it, the second one
asserts torch's default.  Rows that do not exist in the running torch (for
example ``cuda.matmul.prefer_cublaslt_grouped_gemm`` before 2.14) are skipped
with the registry's reason, so the same file checks torch 2.13 and 2.14.
"""

from __future__ import annotations

import textwrap

import pytest
import torch  # here, not inside a test: pytester drops modules a test imports

from pytest_backends.flags import registry

pytest_plugins = ["pytester"]

# row -> (code that changes it and never restores it, code that asserts the default)
PAIRS: dict[str, tuple[str, str]] = {
    "backends.module_attributes": (
        """
        torch.backends.nnpack.enabled = False  # nnpack has no such property: torch ignores it
        torch.backends.cuda.flash_sdp_enabled = False  # a function replaced by a bool
        """,
        """
        assert not hasattr(torch.backends.nnpack, "enabled")
        assert torch.backends.cuda.flash_sdp_enabled() is True
        """,
    ),
    "autocast.nesting": (
        """
        ctx = torch.autocast("cpu", dtype=torch.bfloat16)
        ctx.__enter__()  # never exited
        torch.nn.Linear(8, 8)(torch.randn(2, 8))
        """,
        """
        # a Linear under autocast, its weight changed, run again: a stale cast
        # cache (nesting never back to 0) would give the old bf16 weight
        torch.manual_seed(0)
        lin, x = torch.nn.Linear(8, 8), torch.randn(2, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y1 = lin(x)
        with torch.no_grad():
            lin.weight.mul_(2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y2 = lin(x)
        assert not torch.equal(y1, y2)
        assert not torch.is_autocast_enabled("cpu")
        """,
    ),
    "printoptions.precision": (
        "torch.set_printoptions(precision=10, sci_mode=True, linewidth=40)",
        'assert str(torch.tensor([1 / 3])) == "tensor([0.3333])"',
    ),
    "sparse.check_invariants": (
        "torch.sparse.check_sparse_tensor_invariants.enable()",
        "assert not torch.sparse.check_sparse_tensor_invariants.is_enabled()",
    ),
    "jit.profiling_executor": (
        "torch._C._jit_set_profiling_executor(False)",
        """
        old = torch._C._jit_set_profiling_executor(True)
        assert old is True
        """,
    ),
    "jit.profiling_mode": (
        "torch._C._jit_set_profiling_mode(False)",
        """
        old = torch._C._jit_set_profiling_mode(True)
        assert old is True
        """,
    ),
    "jit.texpr_fuser": (
        "torch._C._jit_set_texpr_fuser_enabled(False)",
        "assert torch._C._jit_texpr_fuser_enabled()",
    ),
    "jit.can_fuse_on_cpu": (
        "torch._C._jit_override_can_fuse_on_cpu(True)",
        "assert not torch._C._jit_can_fuse_on_cpu()",
    ),
    "jit.graph_executor_optimize": (
        "torch._C._set_graph_executor_optimize(False)",
        "assert torch._C._get_graph_executor_optimize()",
    ),
    "autograd.multithreading_enabled": (
        "torch.autograd.set_multithreading_enabled(False)",
        "assert torch._C._is_multithreading_enabled()",
    ),
    "autograd.fwd_grad_enabled": (
        "torch._C._set_fwd_grad_enabled(False)",
        "assert torch._C._is_fwd_grad_enabled()",
    ),
    "autograd.view_replay_enabled": (
        "torch._C._set_view_replay_enabled(True)",
        "assert not torch._C._is_view_replay_enabled()",
    ),
    "miopen.immediate": (
        "torch.backends.miopen.immediate = True",
        "assert not torch.backends.miopen.immediate",
    ),
    "cuda.preferred_rocm_fa_library": (
        'torch.backends.cuda.preferred_rocm_fa_library("ck")',
        'assert str(torch.backends.cuda.preferred_rocm_fa_library()).endswith("Default")',
    ),
    "cuda.matmul.prefer_cublaslt_grouped_gemm": (
        "torch.backends.cuda.matmul.prefer_cublaslt_grouped_gemm = True",
        "assert not torch.backends.cuda.matmul.prefer_cublaslt_grouped_gemm",
    ),
    "python_native.triton.enabled": (
        "torch.backends.python_native.triton.enabled = False",
        "assert torch.backends.python_native.triton.enabled",
    ),
    "python_native.cutedsl.enabled": (
        "torch.backends.python_native.cutedsl.enabled = False",
        "assert torch.backends.python_native.cutedsl.enabled",
    ),
    "python_native.helion.enabled": (
        "torch.backends.python_native.helion.enabled = False",
        "assert torch.backends.python_native.helion.enabled",
    ),
    "python_native.disabled_operations": (
        'torch.backends.python_native.disable_operations("scaled_mm")',
        'assert not torch.backends.python_native.is_operation_disabled("scaled_mm")',
    ),
    "python_native.disabled_dispatch_keys": (
        'torch.backends.python_native.disable_dispatch_keys("CUDA")',
        """
        from torch._native.registry import _filter_state
        assert not _filter_state._dispatch_keys
        """,
    ),
    "cuda.sync_debug_mode": (
        'torch.cuda.set_sync_debug_mode("warn")',
        "assert torch.cuda.get_sync_debug_mode() == 0",
    ),
}


def _ident(name: str) -> str:
    return name.replace(".", "_")


def _module() -> str:
    parts = ["import pytest", "import torch", "from pytest_backends.flags import registry", ""]
    for name, (change, check) in PAIRS.items():
        skip = (
            f"    if {name!r} in registry().absent:\n"
            f"        pytest.skip({name!r} + ': ' + registry().absent[{name!r}])\n"
        )
        parts.append(
            f"def test_set_{_ident(name)}():\n{skip}"
            + textwrap.indent(textwrap.dedent(change).strip(), "    ")
            + "\n\n"
        )
        parts.append(
            f"def test_default_after_{_ident(name)}():\n{skip}"
            + textwrap.indent(textwrap.dedent(check).strip(), "    ")
            + "\n\n"
        )
    return "\n".join(parts)


def test_each_row_is_restored_for_the_next_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_rows=_module())
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--backends-leaks=warn", "-rs"
    )
    out = result.stdout.str()
    absent = [name for name in PAIRS if name in registry().absent]
    present = [name for name in PAIRS if name not in absent]
    result.assert_outcomes(passed=2 * len(present), skipped=2 * len(absent))
    # one leak warning per present row (torch may warn of its own, e.g. sync debug mode)
    assert out.count(": BackendsLeakWarning: ") == len(present), out
    for name in present:
        # the leak is named, with the row, in the warning of the test that set it
        assert f"test_rows.py::test_set_{_ident(name)} left torch backend flags changed" in out
        assert f"  {name}: " in out, name


def test_rows_of_the_issue_exist_in_this_torch_or_say_why() -> None:
    reg = registry()
    for name in PAIRS:
        assert (name in reg.by_name) != (name in reg.absent), name
    assert "autocast.nesting" in reg.by_name
    new_in_214 = hasattr(torch._C, "_get_cublaslt_prefer_grouped_gemm")
    assert ("cuda.matmul.prefer_cublaslt_grouped_gemm" in reg.by_name) == new_in_214
    if not torch.cuda.is_available():
        assert "probed only where one exists" in reg.absent["cuda.sync_debug_mode"]


def test_autocast_restore_clears_the_cast_cache_and_nesting() -> None:
    reg = registry()
    before = reg.snapshot()
    lin, x = torch.nn.Linear(8, 8), torch.randn(2, 8)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16)
    ctx.__enter__()
    try:
        y1 = lin(x)
        diff = reg.diff(before, reg.snapshot())
        assert diff["autocast.nesting"] == (0, 1)
        assert diff["autocast.cpu.enabled"] == (False, True)
    finally:
        reg.restore(before)
    assert reg.snapshot() == before
    with torch.no_grad():
        lin.weight.mul_(2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y2 = lin(x)
    assert not torch.equal(y1, y2)


LEGACY_RESTORE = """
import torch

def test_set_default_value():
    assert torch.get_float32_matmul_precision() == "highest"
    torch.set_float32_matmul_precision("highest")

def test_save_and_restore_legacy_tf32():
    old = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old

def test_save_and_restore_f32mp():
    old = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
    finally:
        torch.set_float32_matmul_precision(old)

def test_a_real_leak():
    torch.set_float32_matmul_precision("high")

def test_next_sees_the_start():
    assert torch.backends.cuda.matmul.fp32_precision == "none"
    assert torch.get_float32_matmul_precision() == "highest"
"""


def test_a_legacy_restore_is_not_a_leak_but_is_put_back(pytester: pytest.Pytester) -> None:
    """A leaf written "ieee" where it inherited "ieee": the kernels' precision is unchanged."""
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("this torch has no fp32_precision strings")
    pytester.makepyfile(test_legacy=LEGACY_RESTORE)
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=5, errors=1)
    result.stdout.fnmatch_lines(["*test_a_real_leak left torch backend flags changed:*"])
    assert "test_save_and_restore" not in result.stdout.str().split("short test summary")[-1]
    assert "test_set_default_value left" not in result.stdout.str()


LEGACY_FIXTURES = """
import pytest
import torch


def _high_then_highest():
    torch.set_float32_matmul_precision("high")
    yield
    torch.set_float32_matmul_precision("highest")


fn_prec = pytest.fixture(_high_then_highest, name="fn_prec")
cls_prec = pytest.fixture(_high_then_highest, scope="class", name="cls_prec")
mod_prec = pytest.fixture(_high_then_highest, scope="module", name="mod_prec")
sess_prec = pytest.fixture(_high_then_highest, scope="session", name="sess_prec")


@pytest.fixture
def tf32_saved():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


@pytest.fixture
def leaks():
    torch.set_float32_matmul_precision("medium")
    yield


def test_a_real_fixture_leak(leaks):
    pass


def test_next_sees_the_start():
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("name", ["fn_prec", "cls_prec", "mod_prec", "tf32_saved", "sess_prec"])
def test_restored_by_its_fixture(request, name):
    request.getfixturevalue(name)
"""


def test_a_fixture_restoring_through_the_legacy_setters_is_not_a_leak(
    pytester: pytest.Pytester,
) -> None:
    """As in a test body, a fixture of any scope writing back "highest" over an inherited "none".

    The legacy setters write the leaves themselves ("none" becomes "ieee", the
    kernels' precision unchanged), so comparing the strings blamed the fixture.
    """
    if not hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        pytest.skip("this torch has no fp32_precision strings")
    pytester.makepyfile(test_legacy_fixtures=LEGACY_FIXTURES)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=7, errors=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*fixture 'leaks' (function scope*", "*'highest' -> 'medium'*"])
    for name in ("fn_prec", "cls_prec", "mod_prec", "sess_prec", "tf32_saved"):
        assert f"fixture '{name}'" not in out, out
    assert "leaked by fixtures" not in out, out


def test_a_snapshot_read_back_from_json_has_no_differences() -> None:
    import json

    from pytest_backends import diff_flags, snapshot_flags

    saved = json.loads(json.dumps(snapshot_flags()))
    assert diff_flags(saved, snapshot_flags()) == {}


MODULE_ATTRIBUTES = """
import torch

def test_lazy_imports_are_no_change():
    import torch.backends.xeon.run_cpu  # a submodule import adds module attributes
    torch.backends.cudnn.version()      # torch caches the version in a private global

def test_replace_a_submodule():
    torch.backends.cudnn = None

def test_delete_the_conftest_attribute():
    assert torch.backends.nnpack.enabled is False
    del torch.backends.nnpack.enabled

def test_back_to_the_baseline():
    assert torch.backends.cudnn.enabled is torch._C._get_cudnn_enabled()
    assert torch.backends.nnpack.enabled is False
"""


def test_attributes_set_on_backends_modules_are_reported_and_put_back(
    pytester: pytest.Pytester,
) -> None:
    """``torch.backends.nnpack.enabled = False`` adds an attribute torch never reads.

    It stayed for every later test, unreported. A conftest's is the suite's
    baseline (put back when a test deletes it); a submodule a test replaces
    is put back; importing a submodule, or torch's own private caches, is no change.
    """
    pytester.makeconftest("import torch\ntorch.backends.nnpack.enabled = False\n")
    pytester.makepyfile(test_attrs=MODULE_ATTRIBUTES)
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, errors=2)
    out = result.stdout.str()
    assert "torch.backends.nnpack.enabled = False (no such attribute" in out, out
    assert "ERROR at teardown of test_replace_a_submodule" in out
    assert "torch.backends.cudnn = None (torch's: the module torch.backends.cudnn)" in out
    assert "ERROR at teardown of test_delete_the_conftest_attribute" in out
    assert "lazy_imports" not in out.split("short test summary info")[-1]


def test_a_default_device_context_left_installed_is_removed_the_way_torch_removes_it(
    pytester: pytest.Pytester,
) -> None:
    # set_default_device("cpu") installs a device-context mode whose device is
    # torch's default: the mode stack is what changed, and putting it back must
    # also drop torch's own record of that context, as set_default_device(None)
    # does, or a later set_default_device() exits a context that is gone.
    pytester.makepyfile(
        """
        import torch
        import torch.utils._device

        def test_a():
            torch.set_default_device("cpu")

        def test_b():
            assert torch._C._len_torch_function_stack() == 0
            assert getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None) is None
            assert torch.utils._device.CURRENT_DEVICE is None
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*test_a left torch backend flags changed:*"])
