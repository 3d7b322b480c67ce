"""``assert_paths_agree`` across mkldnn on/off: bit differences pass, a planted op is named."""

from __future__ import annotations

import fnmatch
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from pytest_backends import PathsDisagreeError, assert_paths_agree
from pytest_backends.paths.api import _run, first_divergence

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)


@torch.library.custom_op("paths_tests::bump", mutates_args=())
def bump(x: torch.Tensor) -> torch.Tensor:
    """Adds 1e-2 only while oneDNN is enabled: a planted path-dependent op."""
    return x + (1e-2 if torch.backends.mkldnn.enabled else 0.0)


def _bump_backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
    return grad


bump.register_autograd(_bump_backward)


def _conv_matmul(x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3)
    y = conv(x)
    return y.flatten(1) @ torch.randn(y[0].numel(), 5)


def test_mkldnn_conv_and_matmul_differ_in_bits_but_agree() -> None:
    torch.manual_seed(1)
    x = torch.randn(4, 3, 16, 16, requires_grad=True)
    with torch.backends.mkldnn.flags(enabled=True):
        on = _conv_matmul(x)
    with torch.backends.mkldnn.flags(enabled=False):
        off = _conv_matmul(x)
    if torch.equal(on, off):
        pytest.skip("mkldnn on and off give identical bits on this machine")
    assert_paths_agree(_conv_matmul, x, axes=["mkldnn"])


def _planted(x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    y = nn.Conv2d(3, 4, 3)(x)
    y = torch.relu(y)
    y = bump(y)  # PLANTED
    return y.sum(dim=(2, 3))


def _planted_line() -> str:
    lines = Path(__file__).read_text().splitlines()
    return f"{__file__}:{next(i for i, s in enumerate(lines, 1) if s.endswith('# PLANTED'))}"


def test_planted_op_after_a_conv_is_named_with_its_line() -> None:
    torch.manual_seed(2)
    x = torch.randn(2, 3, 10, 10, requires_grad=True)
    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(_planted, x, axes=["mkldnn"])
    d = info.value.divergence
    assert d is not None
    assert d.op == "paths_tests::bump"
    assert d.site == _planted_line()
    text = str(info.value)
    assert "the paths part at paths_tests::bump" in text
    assert "tolerance certificate" in text and "dtype eps" in text
    assert "mkldnn.enabled" in text or "flags" in text


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = bump(torch.relu(self.conv(x)))
        return self.head(y.mean(dim=(2, 3)))


def test_planted_op_is_named_in_a_module_and_reference_can_be_chosen() -> None:
    torch.manual_seed(3)
    net = _Net()
    x = torch.randn(2, 3, 8, 8)
    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(net, x, axes={"mkldnn": ["on", "off"]}, reference="mkldnn-off")
    d = info.value.divergence
    assert d is not None and d.op == "paths_tests::bump"
    assert d.module == "_Net"
    assert (d.reference, d.other) == ("mkldnn-off", "mkldnn-on")


def _extra_on_one_path(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    if torch.backends.mkldnn.enabled:
        y = y.clone()  # an op that runs on one path only
        y = y + 0
    y = torch.tanh(y)
    return bump(y) * 3


def test_an_op_on_one_path_only_does_not_derail_alignment() -> None:
    x = torch.randn(5, 7)
    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(_extra_on_one_path, x, axes=["mkldnn"], backward=False)
    d = info.value.divergence
    assert d is not None and d.op == "paths_tests::bump"


_SHARED = np.ones(8, np.float32)
_SHARED_TENSOR = torch.from_numpy(_SHARED)


def _numpy_wrote(value: float) -> torch.Tensor:
    _SHARED[:] = value
    return _SHARED_TENSOR


def _mkldnn_on() -> bool:
    return bool(torch.backends.mkldnn.enabled)


@pytest.mark.parametrize(
    ("fn", "shown"),
    [
        (lambda t: (t * (1 if _mkldnn_on() else -1)).argmax(1), "elements differ"),
        (lambda t: torch.arange(4) + (0 if _mkldnn_on() else 1), "4 of 4 elements differ"),
        (lambda t: t > (0 if _mkldnn_on() else 10), "elements differ"),
        (lambda t: float(t.sum()) + (1.0 if _mkldnn_on() else 0.0), "max abs error 1"),
        (lambda t: int(t.argmax()) + (1 if _mkldnn_on() else 0), "compared exactly"),
        (lambda t: complex(float(t.sum()), 1.0 if _mkldnn_on() else 0.0), "max abs error 1"),
        (lambda t: (t.relu(), 1) if _mkldnn_on() else (t.relu(), 2), "output 1: 2 vs 1"),
        (lambda t: (t.relu(), t.argmax(1)) if _mkldnn_on() else {"a": t.relu()}, "structure"),
    ],
)
def test_results_that_are_not_floats_are_compared_exactly(fn: Any, shown: str) -> None:
    x = torch.randn(4, 8)
    with pytest.raises(PathsDisagreeError, match=shown):
        assert_paths_agree(fn, x, axes=["mkldnn"], backward=False)
    assert_paths_agree(
        lambda t: (t.relu(), t.argmax(1), 3, {"n": t > 0}, float(t.sum()), 1j * float(t.sum())),
        x,
        axes=["mkldnn"],
    )


def test_bad_axes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="nothing to compare"):
        assert_paths_agree(torch.sin, torch.randn(3), axes={"mkldnn": ["on"]})
    with pytest.raises(ValueError, match="lists value 'on' more than once"):
        assert_paths_agree(torch.sin, torch.randn(3), axes={"mkldnn": ["on", "on"]})
    with pytest.raises(ValueError, match="new process"):
        assert_paths_agree(torch.sin, torch.randn(3), axes=["cpu_capability"])
    with pytest.raises(ValueError, match="reference"):
        assert_paths_agree(torch.sin, torch.randn(3), axes=["mkldnn"], reference="nope")
    with pytest.raises((ValueError, TypeError)):
        assert_paths_agree(torch.sin, torch.randn(3), axes="mkldnn")


def _load_zoo() -> ModuleType:
    path = Path(__file__).parents[1] / "determinism" / "zoo.py"
    name = "pytest_backends_tests_paths_zoo"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_no_false_blames_on_the_zoo_across_mkldnn() -> None:
    from pytest_backends.matrix.axes import builtin_registry

    zoo = _load_zoo()
    reg = builtin_registry()
    flags = {
        v: dict(reg.axis("mkldnn").value(v).resolve_flags(frozenset({"mkldnn.enabled"})))
        for v in ("on", "off")
    }
    blamed: dict[str, str] = {}
    for name in sorted(zoo.ZOO):
        torch.manual_seed(0)
        fn, args = zoo.ZOO[name]("cpu")
        runs = [_run(fn, args, f"mkldnn-{v}", flags[v], "cpu", True) for v in ("on", "off")]
        d = first_divergence(runs[0], runs[1])
        if d is not None:
            blamed[name] = d.describe()
    assert blamed == {}, blamed


def test_the_certificate_names_the_kernels_the_op_ran_under_each_config() -> None:
    from pytest_backends.paths.api import _kernels_of

    x = torch.randn(16, 3, 16, 16)  # batch 16: torch sends the conv to oneDNN
    run = _run(
        lambda t: nn.functional.conv2d(t, torch.ones(8, 3, 3, 3)), [x], "a", {}, "cpu", False
    )
    conv = next(r for r in run.records if r.name.startswith("aten::convolution"))
    on = _kernels_of(conv, "mkldnn-on", {"mkldnn.enabled": True})
    off = _kernels_of(conv, "mkldnn-off", {"mkldnn.enabled": False})
    # oneDNN's log names the primitive the conv ran under oneDNN, and none without it.
    assert on.startswith("[mkldnn-on] convolution "), on
    assert off == "[mkldnn-off] no oneDNN primitive (ATen's own kernel)"

    # A blamed op's certificate says which kernels it ran.
    torch.manual_seed(2)
    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(_planted, torch.randn(2, 3, 10, 10), axes=["mkldnn"], backward=False)
    assert "  kernels seen: [mkldnn-on] no oneDNN primitive (ATen's own kernel); [mkldnn-off] " in (
        str(info.value)
    )


@pytest.mark.parametrize(
    "fn",
    [
        lambda t: t.masked_fill(torch.arange(8) < 8, float("-inf")).softmax(-1),  # NaN rows
        lambda t: torch.log(t - 10),  # NaN everywhere
        lambda t: t * float("inf"),  # infinities of both signs
        lambda t: (t, float("nan")),  # a Python NaN
    ],
)
def test_identical_nans_and_infinities_agree(fn: Any) -> None:
    """The same NaNs and infinities on both paths are the same result (NaN equals NaN)."""
    assert_paths_agree(fn, torch.randn(4, 8), axes=["mkldnn"], backward=False)


@pytest.mark.parametrize(
    ("fn", "shown", "head"),
    [
        (
            lambda t: t * (float("inf") if _mkldnn_on() else -float("inf")),
            "max abs error inf",
            "aten::mul at * got other non-tensor arguments under mkldnn-off (-inf) than under "
            "mkldnn-on (inf): a Python value that differs between the paths",
        ),
        (
            lambda t: t * (float("nan") if _mkldnn_on() else 1.0),
            "max abs error inf",
            "got other non-tensor arguments under mkldnn-off (1.0) than under mkldnn-on (nan)",
        ),
        (
            lambda t: t if _mkldnn_on() else t.double(),
            "torch.float64 [4, 8] vs",
            "aten::_to_copy at * ran under mkldnn-off only: the paths ran different ops",
        ),
        (
            lambda t: t if _mkldnn_on() else t[:2],
            "[2, 8] vs torch.float32 [4, 8]",
            "aten::slice at * ran under mkldnn-off only: the paths ran different ops",
        ),
        (
            lambda t: torch.where(torch.tensor(_mkldnn_on()), t * 2, t * 3),
            "max abs error",
            "aten::lift_fresh at * got another tensor input 0 under mkldnn-off than under "
            "mkldnn-on, and no op of the run made it: a value from outside torch's ops",
        ),
        (
            lambda t: t * torch.from_numpy(np.full(8, 1.5 if _mkldnn_on() else 2.0, np.float32)),
            "max abs error",
            "aten::lift_fresh at * got another tensor input 0 under mkldnn-off than under "
            "mkldnn-on, and no op of the run made it",
        ),
        (
            # NumPy writes the flag's value into memory a tensor made before the run shares
            lambda t: t * _numpy_wrote(1.5 if _mkldnn_on() else 2.0),
            "max abs error",
            "aten::mul at * got another tensor input 1 under mkldnn-off than under mkldnn-on",
        ),
    ],
)
def test_unlike_nonfinite_values_dtypes_and_shapes_say_what_differs(
    fn: Any, shown: str, head: str
) -> None:
    """A Python branch on the flag is named as one (the op, its site), never a kernel."""
    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(fn, torch.randn(4, 8), axes=["mkldnn"], backward=False)
    assert shown in str(info.value)
    assert fnmatch.fnmatch(str(info.value), f"*{head}*"), str(info.value)
    assert info.value.divergence is None  # no kernel is blamed


@torch.library.custom_op("paths_tests::double", mutates_args=())
def double(x: torch.Tensor) -> torch.Tensor:
    """Doubles ``x`` only while oneDNN is enabled: a planted path-dependent op."""
    return x * (2.0 if torch.backends.mkldnn.enabled else 1.0)


double.register_autograd(lambda ctx, grad: grad)


def test_memory_an_op_freed_is_outside_again_when_reused() -> None:
    """The allocator hands a freed op output's memory to ``torch.tensor(flag)``: still outside."""

    def fn(t: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            s = t.sum() * 1.0  # four-byte op outputs, freed at once
            del s
        return t * torch.tensor(1.0 + _mkldnn_on())

    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(fn, torch.ones(3), axes=["mkldnn"], backward=False)
    assert "aten::lift_fresh at " in str(info.value), str(info.value)
    assert "no op of the run made it" in str(info.value), str(info.value)


def test_values_from_outside_the_ops_that_agree_name_nothing() -> None:
    """A tensor made from Python values the same on both paths is no branch: the paths agree."""
    assert_paths_agree(
        lambda t: torch.where(torch.tensor(True), t * 2, t * torch.from_numpy(np.ones(8, "f4"))),
        torch.randn(4, 8),
        axes=["mkldnn"],
        backward=False,
    )


def test_a_small_result_that_an_op_changes_wholly_is_named_not_passed() -> None:
    """The result bound's floor of scale 1 never hides an op that parts on its own.

    Results of magnitude 1e-6 doubled under one configuration are 100% apart,
    yet within a bound computed at scale 1; the op that doubled them is named.
    """
    x = torch.randn(16, 32)
    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(lambda t: double(t * 1e-6), x, axes=["mkldnn"], backward=False)
    d = info.value.divergence
    assert d is not None and d.op == "paths_tests::double", str(info.value)
    assert "beyond the bound at the result's own scale" in str(info.value)
    # Small results that agree within their own scale's bound still agree.
    assert_paths_agree(lambda t: torch.tanh(t * 1e-6) * 1e-3, x, axes=["mkldnn"], backward=False)


def test_memory_an_op_leaves_unwritten_never_makes_it_reproduce_its_recording() -> None:
    """``aten::_ctc_loss`` leaves ``log_alpha`` unwritten beyond each target's length.

    Leftover bytes there could match a recording by chance (the allocator handed
    the same block back) and get the op blamed for bytes no kernel computed;
    replays read them as NaN, so the op never reproduces its recording.
    """
    from pytest_backends.paths.api import _replay

    torch.manual_seed(0)
    logits = torch.randn(12, 3, 6).log_softmax(2)
    targets = torch.randint(1, 6, (3, 4))
    lengths = (torch.full((3,), 12), torch.tensor([1, 4, 2]))
    flags = {"mkldnn.enabled": True}
    run = _run(
        lambda z: torch.nn.functional.ctc_loss(z, targets, *lengths),
        [logits],
        "on",
        flags,
        "cpu",
        False,
    )
    record = next(r for r in run.records if r.name == "aten::_ctc_loss")
    for _ in range(2):
        junk = torch.full((3 * 12 * 9,), 2.5e38)  # leftover bytes for the next block of this size
        del junk
        replayed = _replay(record, flags)
        assert replayed is not None
        alpha = replayed[1]
        assert bool(alpha[0, 1:, 3:].isnan().all()), alpha[0]  # beyond 2 * 1 + 1, after t = 0
        assert not bool(alpha[1].isnan().any())  # the longest target: every element written
        assert not torch.equal(alpha.nan_to_num(), record.outputs[1].nan_to_num())


def test_missing_axes_a_bad_fn_and_an_unrunnable_reference_say_so() -> None:
    """No axes, ``axes=None`` and a non-callable ``fn`` are errors naming the argument
    (they were a marker's message and raw ``TypeError``s); a reference this machine
    cannot run skips with its reason (it was "not one of the configurations")."""
    with pytest.raises(ValueError, match="axes names no axis"):
        assert_paths_agree(torch.sin, torch.randn(3))
    with pytest.raises(TypeError, match="axes is a list of axis names"):
        assert_paths_agree(torch.sin, torch.randn(3), axes=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fn must be callable"):
        assert_paths_agree(3, torch.randn(3), axes=["mkldnn"])  # type: ignore[arg-type]
    # A tensor passed as fn by mistake is named by its type and shape, not printed whole.
    with pytest.raises(TypeError, match=r"got a Tensor of shape \[64, 64\]$"):
        assert_paths_agree(torch.randn(64, 64), axes=["mkldnn"])  # type: ignore[arg-type]
    if not torch.cuda.is_available():
        with pytest.raises(pytest.skip.Exception, match="reference configuration 'cudnn-on"):
            assert_paths_agree(
                torch.sin, torch.randn(3), axes=["cudnn", "mkldnn"], reference="cudnn-on,mkldnn-on"
            )
    with pytest.raises(ZeroDivisionError) as info:
        assert_paths_agree(
            lambda t: t if torch.backends.mkldnn.enabled else 1 / 0, torch.randn(3), axes=["mkldnn"]
        )
    if sys.version_info >= (3, 11):
        assert "under configuration mkldnn-off" in "".join(info.value.__notes__)


@pytest.mark.parametrize(
    "make",
    [torch.Generator, object, lambda: nn.Linear(2, 2), lambda: lambda: 0],
    ids=["generator", "object", "module", "function"],
)
def test_a_leaf_with_identity_equality_only_is_listed_as_not_compared(make: Any) -> None:
    """Each run returns a new object whose type compares by identity: not a numeric
    result, so never a disagreement; the result and the message list it (path, type)."""
    kind = type(make())
    name = f"{kind.__module__}.{kind.__qualname__}"
    x = torch.randn(4, 8)
    result = assert_paths_agree(lambda t: (t.relu(), make()), x, axes=["mkldnn"], backward=False)
    assert result.not_compared == (f"output 1 ({name})",), result
    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(lambda t: (bump(t), make()), x, axes=["mkldnn"], backward=False)
    text = str(info.value)
    assert "output 0: max abs error" in text and "output 1:" not in text, text
    assert f"not compared (identity equality only, not numeric results): output 1 ({name})" in text
    assert info.value.not_compared == result.not_compared


@pytest.mark.parametrize(
    ("on", "off"),
    [
        (torch.float32, torch.float64),
        (torch.strided, torch.sparse_coo),
        (torch.Size([2, 3]), torch.Size([2, 4])),
        (torch.device("cpu"), torch.device("meta")),
        (None, 0),
        ("a", "b"),
    ],
)
def test_plain_values_are_still_compared_by_equality(on: object, off: object) -> None:
    """dtypes, layouts, sizes, devices, None and strings are values: compared by equality."""
    x = torch.randn(4, 8)
    result = assert_paths_agree(lambda t: (t.relu(), on), x, axes=["mkldnn"], backward=False)
    assert result.not_compared == ()
    with pytest.raises(PathsDisagreeError, match=r"output [12]: "):
        assert_paths_agree(
            lambda t: (t.relu(), on if _mkldnn_on() else off), x, axes=["mkldnn"], backward=False
        )


# --- results and ops outside float tensors (NumPy, in-place custom ops, integers) ------------


def test_numpy_results_are_compared_as_tensors_not_by_their_text() -> None:
    """A large array differing in one middle element fails; rounding within bounds agrees.

    The truth by hand: NumPy shortens the text of arrays over 1,000 elements, so a
    comparison of ``repr`` passes the first and fails the second on its printed digits.
    """

    def big(t: torch.Tensor) -> Any:
        y = torch.tanh(t).repeat(1, 100)
        if _mkldnn_on():
            y[4, 800] += 1.0
        return y.numpy()

    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(big, torch.randn(8, 16), axes=["mkldnn"], backward=False)
    assert "max abs error 1" in str(info.value), str(info.value)
    conv = nn.Conv2d(3, 8, 3, padding=1).eval()
    x = torch.randn(2, 3, 16, 16)
    assert_paths_agree(lambda t: conv(t).detach().numpy(), x, axes=["mkldnn"], backward=False)


@torch.library.custom_op("paths_tests::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor) -> None:
    """Scales ``x`` in place by 1% only while oneDNN is enabled, and returns nothing."""
    if torch.backends.mkldnn.enabled:
        x.mul_(1.01)


@torch.library.custom_op("paths_tests::shift", mutates_args=())
def shift(x: torch.Tensor) -> torch.Tensor:
    """Adds 1 to an integer tensor only while oneDNN is enabled."""
    return x + 1 if torch.backends.mkldnn.enabled else x.clone()


@shift.register_fake
def _shift_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _in_place(t: torch.Tensor) -> torch.Tensor:
    h = t * 2
    scale_(h)
    return h + 1


def _integer(t: torch.Tensor) -> torch.Tensor:
    return (shift((t * 10).long()) * 3).sum()


@pytest.mark.parametrize(
    ("fn", "op", "shown"),
    [
        (_in_place, "paths_tests::scale_", "max rel error 0.0099"),
        (_integer, "paths_tests::shift", "max rel error 1 (max abs 1), bound 0 + 0*|x|"),
    ],
    ids=["in-place, returns nothing", "integer output"],
)
def test_an_op_that_writes_its_argument_or_an_integer_output_is_blamed(
    fn: Any, op: str, shown: str
) -> None:
    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(fn, torch.randn(8, 16), axes=["mkldnn"], backward=False)
    divergence = info.value.divergence
    assert divergence is not None and divergence.op == op, str(info.value)
    assert divergence.inputs_agreed
    assert shown in str(info.value), str(info.value)


def test_ops_torch_chose_for_one_call_are_not_called_a_python_branch() -> None:
    """sdpa math vs flash: the same call site runs other ops; no ``if`` in the user's code."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 32, dtype=torch.bfloat16) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(sdpa, q, k, v, axes={"sdpa": ["math", "flash"]}, backward=False)
    text = str(info.value)
    assert "branches on a flag in Python" not in text, text
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in text, text
    assert "torch chose other ops for the same call" in text, text
