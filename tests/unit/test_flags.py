"""The flag registry: every row round-trips, bad input changes nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

from pytest_backends import diff_flags, flag_names, override_flags, restore_flags, snapshot_flags
from pytest_backends.flags import Flag, FlagRegistry, registry
from pytest_backends.flags.catalogue import build_catalogue

# State a test can only leave behind (an open context, a started profiler, a hook, the
# once-only interop thread count) and compiler config read only once imported: each has a
# test of its own in test_switches.py that makes the change the way a test would.
_BY_ACTION = (
    "modes.",
    "nn.module_",
    "autograd.saved_tensors_hooks",
    "autograd.forward_ad.",
    "profiler.",
    "num_interop_threads",
    "inductor.",
    "autograd.inference_mode",
    "serialization.safe_globals",
    "tunableop.results",
    "jit.emit_hooks",
    "serialization.load.endianness",
    "backends.module_attributes",
)
ROWS = [r for r in registry().rows if not r.name.startswith(_BY_ACTION)]


def _other_value(row: Flag, current: object) -> object:
    """A valid value different from ``current`` for any row, derived from its kind."""
    if current == "default" and row.name.startswith("serialization."):
        return {
            "load.mmap_flags": 1,
            "save.storage_alignment": 128,
            "save.compute_crc32": False,
        }.get(row.name.removeprefix("serialization."), True)
    if isinstance(current, bool):
        return not current
    if current is None and row.name == "printoptions.sci_mode":  # automatic
        return True
    if isinstance(current, list) and not current:  # python_native's disabled names
        return ["scaled_mm"] if "operations" in row.name else ["CUDA"]
    if isinstance(current, tuple):
        return (not current[0], current[1])
    if row.name == "sdp.priority_order":
        assert isinstance(current, list)
        return list(reversed(current))
    if row.name == "default_dtype":
        return "float64"
    if row.name == "float32_matmul_precision":
        return "medium"
    if row.name == "default_device":
        return "meta"
    if row.name == "num_threads":
        return 1 if current != 1 else 2
    if row.name == "sm_carveout":
        return 2 if current is None else None
    if isinstance(current, int) and not isinstance(current, bool):
        return current + 1
    for candidate in (
        "error",
        "nothing",
        "file_system",
        "ieee",
        "tf32",
        "bf16",
        "none",
        "highest",
        "medium",
        "high",
        "cusolver",
        "magma",
        "default",
        "cublaslt",
        "cublas",
        "ck",
        "qnnpack",
        "onednn",
        "fbgemm",
        "x86",
        "native",
        "greedy",
        "auto",
        "float16",
        "bfloat16",
    ):
        if candidate != current:
            try:
                if row.check(candidate) == current:
                    continue
            except ValueError:
                continue
            return candidate
    raise AssertionError(f"no alternative value known for {row.name}={current!r}")


def test_snapshot_has_every_flag_of_this_torch() -> None:
    snap = snapshot_flags()
    assert len(snap) >= 30
    for name in (
        "cudnn.enabled",
        "cuda.matmul.fp32_precision",
        "mkldnn.conv.fp32_precision",
        "sdp.flash",
        "sdp.priority_order",
        "deterministic_algorithms",
        "deterministic_algorithms.warn_only",
        "deterministic.fill_uninitialized_memory",
        "default_dtype",
    ):
        assert name in snap
    # plain values only: they survive a JSON round trip
    import json

    assert json.loads(json.dumps(snap)) == {
        k: list(v) if isinstance(v, tuple) else v for k, v in snap.items()
    }


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_row_round_trips_through_override(row: Flag) -> None:
    before = snapshot_flags()
    current = row.plain(row.read()) if row.in_snapshot else before.get(row.name)
    if not row.in_snapshot:
        # legacy aliases (e.g. cuda.matmul.allow_tf32) are written through the
        # legacy API and restored through the fp32_precision strings
        legacy = row.read()
        value: object = not legacy if isinstance(legacy, bool) else True
    else:
        value = _other_value(row, current)
    try:
        with override_flags({row.name: value}):
            inside = snapshot_flags()
            if row.in_snapshot:
                assert inside[row.name] == row.check(value) or row.name == "sdp.priority_order"
    except ValueError as exc:
        # this build cannot take the value (e.g. MAGMA on a CPU build): nothing may change
        assert "cannot be set to" in str(exc)
        assert snapshot_flags() == before, exc
        pytest.skip(f"{row.name}={value!r} not settable on this build: {exc}")
    assert snapshot_flags() == before
    if row.name != "mkldnn.allow_tf32":  # only has an effect on Intel GPU builds
        assert diff_flags(before, inside), f"{row.name}={value!r} changed nothing"


def test_override_restores_on_exception() -> None:
    before = snapshot_flags()
    with pytest.raises(ZeroDivisionError), override_flags({"cudnn.benchmark": True}):
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.use_deterministic_algorithms(True, warn_only=True)
        1 / 0  # noqa: B018
    assert snapshot_flags() == before


@pytest.mark.parametrize(
    ("mapping", "fragments"),
    [
        ({"cudnn.enabld": True}, ["unknown backend flag 'cudnn.enabld'", "cudnn.enabled"]),
        (
            {"cuda.matmul.fp32_precision": "bf16"},
            ["cuda.matmul.fp32_precision", "'ieee'", "'tf32'"],
        ),
        ({"cudnn.benchmark": "yes"}, ["cudnn.benchmark", "True or False"]),
        ({"sdp.priority_order": [0, 0]}, ["sdp.priority_order", "permutation"]),
        ({"default_dtype": "int64"}, ["default_dtype", "'float64'"]),
    ],
)
def test_bad_input_is_a_clear_error_and_changes_nothing(
    mapping: dict[str, Any], fragments: list[str]
) -> None:
    before = snapshot_flags()
    # a valid flag first: validation happens before anything is written
    with pytest.raises(ValueError) as info, override_flags({"mkldnn.enabled": False, **mapping}):
        pass
    for fragment in fragments:
        assert fragment in str(info.value)
    assert snapshot_flags() == before


def test_absent_flag_names_why() -> None:
    reg = registry()
    if not reg.absent:
        pytest.skip("every known flag exists in this torch")
    name, reason = next(iter(reg.absent.items()))
    with pytest.raises(ValueError, match="does not exist in this torch") as info:
        reg.validate({name: True})
    assert reason in str(info.value)


def test_mkldnn_fp32_precision_writes_its_own_key() -> None:
    # torch's own setter also writes the generic/all precision; the registry
    # writes the key the name reads, and restores both.
    before = snapshot_flags()
    with override_flags({"mkldnn.fp32_precision": "bf16"}):
        snap = snapshot_flags()
        assert snap["mkldnn.fp32_precision"] == "bf16"
        assert snap["fp32_precision"] == before["fp32_precision"]
    assert snapshot_flags() == before
    torch.backends.mkldnn.fp32_precision = "bf16"  # the hazard: generic changes too
    try:
        assert snapshot_flags()["fp32_precision"] == "bf16"
    finally:
        restore_flags(before)
    assert snapshot_flags() == before


def test_leaf_inheritance_is_kept_after_restore() -> None:
    before = snapshot_flags()
    with override_flags({"mkldnn.conv.fp32_precision": "ieee"}):
        pass
    # the leaf inherits again: changing its parent shows through
    with override_flags({"mkldnn.fp32_precision": "bf16"}):
        assert snapshot_flags()["mkldnn.conv.fp32_precision"] == "bf16"
    assert snapshot_flags() == before


def test_legacy_precision_getters_would_raise_but_restore_works() -> None:
    before = snapshot_flags()
    with (
        override_flags({"cuda.matmul.fp32_precision": "tf32"}),
        pytest.raises(RuntimeError, match="mix of the legacy and new APIs"),
    ):
        _ = torch.backends.cuda.matmul.allow_tf32
    with override_flags({"cuda.matmul.allow_tf32": True, "float32_matmul_precision": "medium"}):
        assert snapshot_flags()["cuda.matmul.fp32_precision"] == "tf32"
    assert snapshot_flags() == before
    # the legacy value was restored too, so legacy getters agree again
    assert torch.get_float32_matmul_precision() == before["float32_matmul_precision"]
    assert torch.backends.cuda.matmul.allow_tf32 is False


def test_works_after_disable_global_flags_and_keeps_them_frozen() -> None:
    code = textwrap.dedent(
        """
        import torch
        from pytest_backends import override_flags, snapshot_flags
        torch.backends.disable_global_flags()
        before = snapshot_flags()
        with override_flags({"cudnn.benchmark": True, "nnpack.enabled": False}):
            assert torch.backends.cudnn.benchmark is True
            assert torch.backends.flags_frozen()
        assert snapshot_flags() == before
        assert torch.backends.flags_frozen()
        try:
            torch.backends.cudnn.benchmark = True
        except RuntimeError as exc:
            print("still frozen:", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "still frozen" in out.stdout


def test_never_calls_disable_global_flags() -> None:
    assert not torch.backends.flags_frozen()
    with override_flags({"cudnn.enabled": False}):
        assert not torch.backends.flags_frozen()


class _HidingC:
    """torch._C without some attributes: the shape of an older torch."""

    def __init__(self, hidden: set[str]) -> None:
        self._hidden = hidden

    def __getattr__(self, name: str) -> Any:
        if name in self._hidden:
            raise AttributeError(name)
        return getattr(torch._C, name)


class _OldTorch:
    def __init__(self, hidden: set[str]) -> None:
        self._C = _HidingC(hidden)

    def __getattr__(self, name: str) -> Any:
        if name == "get_default_device":
            raise AttributeError(name)  # torch < 2.3
        return getattr(torch, name)


def test_older_torch_without_fp32_precision_uses_legacy_rows() -> None:
    old = _OldTorch(
        {
            "_get_fp32_precision_getter",
            "_set_fp32_precision_setter",
            "_get_cudnn_depthwise_kernel",
            "_get_fa3_sdp_enabled",
            "_set_sdp_use_fa3",
            "_get_sdp_priority_order",
            "_set_sdp_priority_order",
        }
    )
    rows, absent = build_catalogue(old)
    reg = FlagRegistry(old, rows, absent)
    real_before = snapshot_flags()
    snap = reg.snapshot()
    assert "cuda.matmul.fp32_precision" not in snap
    assert "cuda.matmul.allow_tf32" in snap and "cudnn.allow_tf32" in snap
    assert "default_device" not in snap and "sdp.priority_order" not in snap
    assert "fp32_precision API" in absent["cuda.matmul.fp32_precision"]
    with pytest.raises(ValueError, match="does not exist in this torch"):
        reg.validate({"cudnn.conv.fp32_precision": "ieee"})
    before = dict(snap)
    reg.apply(reg.validate({"cuda.matmul.allow_tf32": True, "cudnn.benchmark": True}))
    reg.restore(before)
    assert reg.snapshot() == before
    # the legacy writes went through to the real torch's strings; put them back
    restore_flags(real_before)
    assert snapshot_flags() == real_before


def test_flag_names_lists_aliases_too() -> None:
    names = flag_names()
    assert "cuda.matmul.allow_tf32" in names
    assert "cuda.matmul.allow_tf32" not in snapshot_flags()
