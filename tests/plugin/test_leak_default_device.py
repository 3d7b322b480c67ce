"""A default device left set is reported as the default device, as the user set it.

``torch.set_default_device(...)`` and ``with torch.device(...)`` push torch's
``DeviceContext`` on the torch-function mode stack. A test or fixture that leaves
one installed is reported by what it did (``default_device``, the devices before
and after, the call and how to undo it), not as the internal mode-stack row; other
torch-function modes keep the stack's row and are named by their class. Each case
runs in a real pytest session (``runpytest_subprocess``), and the next test sees
torch's own state again.
"""

from __future__ import annotations

import copy
import pickle
import textwrap

import pytest

from pytest_backends.flags.mode_stack import ModeStack

pytest_plugins = ["pytester"]

# The state set_default_device(None) leaves: no mode, no recorded context, tensors on the CPU.
RESTORED = """
def assert_restored():
    import torch.utils._device

    assert torch._C._len_torch_function_stack() == 0
    assert getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None) is None
    assert torch.utils._device.CURRENT_DEVICE is None
    assert torch.get_default_device() == torch.device("cpu")
    assert torch.empty(2).device.type == "cpu"
    torch.set_default_device("meta")  # torch's own calls still work after the restore
    assert torch.empty(2).device.type == "meta"
    torch.set_default_device(None)
    assert torch._C._len_torch_function_stack() == 0
"""


def _session(pytester: pytest.Pytester, header: str, tests: str) -> pytest.RunResult:
    """A test module (``header``, the restore check, ``tests``) run in a subprocess."""
    pytester.makepyfile(header + RESTORED + textwrap.dedent(tests))
    return pytester.runpytest_subprocess("-p", "no:randomly")


def _leak_report(result: pytest.RunResult, test: str) -> str:
    """The teardown error of ``test``."""
    out = result.stdout.str()
    start = out.index(f"ERROR at teardown of {test}")
    return out[start : out.index("They were restored", start)]


def test_set_default_device_cpu_is_named_as_the_default_device(
    pytester: pytest.Pytester,
) -> None:
    result = _session(
        pytester,
        "import torch\n",
        """
        def test_a():
            torch.set_default_device("cpu")

        def test_b():
            assert_restored()
        """,
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_a*",
            "*test_*.py::test_a left torch backend flags changed:",
            "  default_device: 'cpu' -> 'cpu' (torch.set_default_device('cpu') was left set*; "
            "undo it with torch.set_default_device(None))",
        ]
    )
    assert "modes.torch_function_stack" not in result.stdout.str()
    assert "test_b" not in "".join(line for line in result.outlines if "ERROR" in line)


def test_set_default_device_meta_is_one_line_with_the_call(pytester: pytest.Pytester) -> None:
    result = _session(
        pytester,
        "import torch\n",
        """
        def test_a():
            torch.set_default_device("meta")

        def test_b():
            assert_restored()
        """,
    )
    result.assert_outcomes(passed=2, errors=1)
    report = _leak_report(result, "test_a")
    assert "test_a left torch backend flags changed:" in report
    # the recorded device's row and the mode stack's are one line, saying what was called
    assert report.count("default_device:") == 1, report
    assert (
        "  default_device: 'cpu' -> 'meta' (torch.set_default_device('meta') was left set; "
        "undo it with torch.set_default_device(None))" in report
    ), report
    assert "modes.torch_function_stack" not in report


def test_a_module_fixture_that_sets_the_default_device_is_named(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_a_module="""
        import pytest
        import torch

        @pytest.fixture(scope="module")
        def on_cpu():
            torch.set_default_device("cpu")
            yield

        def test_one(on_cpu):
            assert torch.get_default_device() == torch.device("cpu")

        def test_two(on_cpu):
            assert torch._C._len_torch_function_stack() == 1
        """,
        test_b_after="import torch\n"
        + RESTORED
        + """
        def test_after():
            assert_restored()
        """.replace("\n        ", "\n"),
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*= torch backend flags leaked by fixtures =*",
            "fixture 'on_cpu' (module scope, defined in test_a_module.py) changed torch "
            "backend flags and did not restore them in its teardown:",
            "  default_device: 'cpu' -> 'cpu' (torch.set_default_device('cpu') was left set*; "
            "undo it with torch.set_default_device(None))",
        ]
    )
    assert "modes.torch_function_stack" not in result.stdout.str()


def test_a_torch_device_context_left_open_by_a_fixture_is_named(
    pytester: pytest.Pytester,
) -> None:
    result = _session(
        pytester,
        "import pytest\nimport torch\n",
        """
        KEEP = []

        def _on(device):
            with torch.device(device):
                yield

        @pytest.fixture
        def on_cpu():
            body = _on("cpu")
            next(body)  # inside the with block, which is never left
            KEEP.append(body)
            yield

        def test_a(on_cpu):
            assert torch.get_default_device() == torch.device("cpu")

        def test_b():
            assert_restored()
        """,
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_a*",
            "fixture 'on_cpu' (function scope, defined in test_*.py) changed torch backend "
            "flags and did not restore them in its teardown:",
            "  default_device: 'cpu' -> 'cpu' (a torch.device('cpu') context was entered and "
            "not exited; exit it, or use `with torch.device('cpu'):` around the code that "
            "needs it)",
        ]
    )
    assert "modes.torch_function_stack" not in result.stdout.str()


def test_other_function_modes_keep_the_stack_row_and_name_their_class(
    pytester: pytest.Pytester,
) -> None:
    result = _session(
        pytester,
        "import torch\nfrom torch.overrides import TorchFunctionMode\n",
        """
        class Passthrough(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        def test_mode():
            Passthrough().__enter__()  # never exited

        def test_both():
            torch.set_default_device("meta")
            Passthrough().__enter__()

        def test_after():
            assert_restored()
        """,
    )
    result.assert_outcomes(passed=3, errors=2)
    mode = _leak_report(result, "test_mode")
    assert "  modes.torch_function_stack: 0 -> 1 (entered and not exited: Passthrough)" in mode
    assert "default_device" not in mode
    both = _leak_report(result, "test_both")
    assert (
        "  default_device: 'cpu' -> 'meta' (torch.set_default_device('meta') was left set; "
        "undo it with torch.set_default_device(None))" in both
    ), both
    assert "  modes.torch_function_stack: 0 -> 2 (entered and not exited: Passthrough)" in both


def test_the_stack_value_is_its_depth() -> None:
    # compared, written back, shown and serialised as the int it always was
    stack = ModeStack(((1, object(), False), (2, object(), True)))
    assert stack == 2 and repr(stack) == "2" and f"{stack!r}" == "2"
    assert copy.deepcopy(stack) == 2 and pickle.loads(pickle.dumps(stack)) == 2
    assert type(copy.copy(stack)) is int
