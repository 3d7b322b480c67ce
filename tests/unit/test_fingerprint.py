"""The fast fingerprint agrees with the slow, obviously right one: every row read alone.

The fingerprint reads groups of rows in one call and skips the rows of a closed gate
(:mod:`pytest_backends.flags.registry`).  The oracle is each row's own ``read``.  A corpus
of states (hypothesis, combinations of changes that open each gate and change rows
behind it) must give the same plain values both ways, and two states whose plain
values differ must give different fingerprints.
"""

from __future__ import annotations

import contextvars
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from fingerprint_corpus import Change, disagreements

from pytest_backends.flags import FlagRegistry
from pytest_backends.flags.catalogue import build_catalogue
from pytest_backends.flags.registry import _global_reader, faster_readers
from pytest_backends.flags.switches import _unset_sentinel

_UNSET = _unset_sentinel()


class _Entry:
    """The part of a config module's entry the rows read: the user override and the default."""

    def __init__(self, default: object) -> None:
        self.default = default
        self.user_override: contextvars.ContextVar[object] = contextvars.ContextVar(
            "override", default=_UNSET
        )


def _fake_inductor() -> types.ModuleType:
    module = types.ModuleType("torch._inductor.config")
    module._config = {  # type: ignore[attr-defined]
        key: _Entry(False) for key in ("deterministic", "fallback_random", "numerics")
    }
    return module


def _set_autocast(device: str) -> Callable[[], None]:
    torch.set_autocast_enabled(device, True)
    return lambda: torch.set_autocast_enabled(device, False)


def _hook() -> Callable[[], None]:
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: o)
    return handle.remove


def _print_precision() -> Callable[[], None]:
    torch.set_printoptions(precision=7)
    return lambda: torch.set_printoptions(profile="default")


def _native(kind: str) -> Callable[[], None]:
    native = torch.backends.python_native
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "dsl":
            native.triton.disable()
            return native.triton.enable
        native.disable_operations("aten::add")
        return lambda: native.enable_operations("aten::add")


def _device() -> Callable[[], None]:
    torch.set_default_device("meta")
    return lambda: torch.set_default_device(None)


def _matmul_precision() -> Callable[[], None]:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    return lambda: torch.set_float32_matmul_precision(before)


def _mixed_precision() -> Callable[[], None]:
    before = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    return lambda: setattr(torch.backends.cuda.matmul, "fp32_precision", before)


def _saved_hooks() -> Callable[[], None]:
    ctx = torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    ctx.__enter__()
    return lambda: ctx.__exit__(None, None, None)


def _checkpoint() -> Callable[[], None]:
    import torch.utils.checkpoint as checkpoint

    before = checkpoint._enable_checkpoint_early_stop
    checkpoint._enable_checkpoint_early_stop = False
    return lambda: setattr(checkpoint, "_enable_checkpoint_early_stop", before)


def _torch_function_off() -> Callable[[], None]:
    ctx = torch._C.DisableTorchFunctionSubclass()
    ctx.__enter__()
    return lambda: ctx.__exit__(None, None, None)


def _nesting() -> Callable[[], None]:
    torch.autocast_increment_nesting()
    return torch.autocast_decrement_nesting


def _fastpath() -> Callable[[], None]:
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(not before)
    return lambda: torch.backends.mha.set_fastpath_enabled(before)


def _swap_params() -> Callable[[], None]:
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(not before)
    return lambda: torch.__future__.set_swap_module_params_on_conversion(before)


def _inductor(module: types.ModuleType) -> Callable[[], Callable[[], None]]:
    def change() -> Callable[[], None]:
        token = module._config["fallback_random"].user_override.set(True)  # type: ignore[attr-defined]
        return lambda: module._config["fallback_random"].user_override.reset(token)  # type: ignore[attr-defined]

    return change


@pytest.fixture(scope="module")
def fake_inductor() -> Iterator[types.ModuleType | None]:
    import sys

    if "torch._inductor.config" in sys.modules:  # imported by an earlier test: rows read directly
        yield None
        return
    module = _fake_inductor()
    sys.modules["torch._inductor.config"] = module
    try:
        yield module
    finally:
        sys.modules.pop("torch._inductor.config", None)


@pytest.fixture(scope="module")
def fast_registry(fake_inductor: types.ModuleType | None) -> FlagRegistry:
    import sys

    # built while the config module is absent, so that its gate is in use
    module = sys.modules.pop("torch._inductor.config", None) if fake_inductor else None
    try:
        reg = FlagRegistry(torch, *build_catalogue(torch))
    finally:
        if module is not None:
            sys.modules["torch._inductor.config"] = module
    return reg


def _changes(inductor: types.ModuleType | None) -> list[Change]:
    changes: list[Change] = [
        *((f"autocast {d}", lambda d=d: _set_autocast(d)) for d in ("cpu", "xla", "hpu", "mps")),
        ("module hook", _hook),
        ("print precision", _print_precision),
        ("default device", _device),
        ("matmul precision", _matmul_precision),
        ("fp32 precision string", _mixed_precision),
        ("saved tensors hooks", _saved_hooks),
        ("checkpoint early stop", _checkpoint),
        ("torch function off", _torch_function_off),
        ("autocast nesting", _nesting),
        ("mha fast path", _fastpath),
        ("swap module params", _swap_params),
    ]
    if getattr(torch.backends, "python_native", None) is not None:
        changes += [("native dsl", lambda: _native("dsl")), ("native op", lambda: _native("op"))]
    if inductor is not None:
        changes.append(("inductor option", _inductor(inductor)))
    return changes


def test_the_fingerprint_reads_groups(fast_registry: FlagRegistry) -> None:
    reg = fast_registry
    grouped = [r for r in reg.snapshot_rows if r.group is not None]
    assert len(grouped) >= 20, [r.name for r in grouped]
    assert len(reg.fingerprint()) < len(reg.snapshot_rows) - 20


def test_slow_getters_are_read_through_proved_faster_readers() -> None:
    """The torch-function state, the nesting count and module-global getters."""
    reg = FlagRegistry(torch, *build_catalogue(torch))
    faster = faster_readers(torch, list(reg.rows))
    expected = {
        "modes.torch_function_state",
        "autocast.nesting",
        "mha.fastpath_enabled",
        "future.swap_module_params_on_conversion",
        "multiprocessing.sharing_strategy",
    }
    assert expected & set(reg.by_name) <= set(faster), sorted(faster)
    for name, read in faster.items():
        assert read() == reg.by_name[name].read(), name
    # a getter that does more than return its module global keeps its own reader
    assert _global_reader(torch.get_default_dtype) is None
    assert _global_reader(lambda: reg) is None


def test_fast_fingerprint_agrees_with_every_row_read_alone(
    fast_registry: FlagRegistry, fake_inductor: types.ModuleType | None
) -> None:
    changes = _changes(fake_inductor)
    assert disagreements(fast_registry, changes, max_size=5) == {"cases": 60, "disagreements": 0}


@pytest.mark.parametrize("native", ["auto", "off"])
def test_a_gate_not_proved_here_is_not_used(monkeypatch: pytest.MonkeyPatch, native: str) -> None:
    """An autocast device the gate does not cover is not read through it (mps, maia on 2.13).

    With the native switch key (``auto``, where the extension is built) autocast rows are
    read through the key, not the gate; without it (``off``) through the gate or alone.
    """
    monkeypatch.setenv("PYTEST_BACKENDS_NATIVE", native)
    reg = FlagRegistry(torch, *build_catalogue(torch))
    gate: Any = torch._C._is_any_autocast_enabled
    for row in reg.snapshot_rows:
        if not (row.name.startswith("autocast.") and row.name.endswith(".enabled")):
            continue
        device = row.name.split(".")[1]
        torch.set_autocast_enabled(device, True)
        try:
            if not gate():  # not in the autocast gate's group
                names = row.group.names if row.group is not None else ()
                assert not (names and all(n.startswith("autocast.") for n in names)), row.name
            assert reg.to_plain(reg.fingerprint())[row.name] is True
        finally:
            torch.set_autocast_enabled(device, False)


class _AttributeEntry:
    """A config entry as older torch (2.11) lays it out: the override is a plain attribute."""

    def __init__(self, default: object) -> None:
        self.default = default
        self.user_override: object = _UNSET


@pytest.mark.skipif(_UNSET is None, reason="this torch has no config modules")
def test_config_options_of_an_older_torch_are_read_and_restored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch 2.11 keeps a config option's override in an attribute, not a ContextVar.

    Building the registry then raised AttributeError, which took down every session
    (INTERNALERROR) on the first test that read the flags.
    """
    module = types.ModuleType("torch._inductor.config")
    module._config = {  # type: ignore[attr-defined]
        key: _AttributeEntry(False) for key in ("deterministic", "fallback_random", "numerics")
    }
    monkeypatch.setitem(__import__("sys").modules, "torch._inductor.config", module)
    rows, absent = build_catalogue(torch)
    reg = FlagRegistry(torch, rows, absent)
    name = next(r.name for r in reg.snapshot_rows if r.name.endswith("fallback_random"))
    before = reg.fingerprint()
    assert reg.to_plain(before)[name] == "default"
    module._config["fallback_random"].user_override = True  # type: ignore[attr-defined]
    after = reg.fingerprint()
    assert after != before and reg.to_plain(after)[name] is True
    reg.restore(reg.to_plain(before))
    assert module._config["fallback_random"].user_override is _UNSET  # type: ignore[attr-defined]
    assert reg.fingerprint() == before
