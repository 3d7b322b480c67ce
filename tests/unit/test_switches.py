"""The sentinel: every switch torch has is a catalogue row or known not to be state.

Discovery runs on the installed torch and, offline, on the getter/setter names of the
torch 2.13, 2.14.1 and 2.15.0 wheels (``tests/data/torch-switches``), so a switch a
newer torch adds is named without installing it.  Removing a row makes the check
name the switch it managed.  The runtime net reports an unknown switch a test changes.
"""

from __future__ import annotations

import functools
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from pytest_backends.flags import FlagRegistry, registry
from pytest_backends.flags.catalogue import build_catalogue
from pytest_backends.flags.surface import classify, declared_row, discover, name_list

LISTS = sorted((Path(__file__).parent.parent / "data" / "torch-switches").glob("*.names"))


def _known_rows() -> set[str]:
    reg = registry()
    return set(reg.names()) | set(reg.absent)


def test_installed_torch_has_no_unknown_switch() -> None:
    # Discovery lists inductor's options once something imported its config: this
    # test must not depend on whether an earlier test in the process did.
    import torch._inductor.config

    surface = classify(discover(torch), _known_rows())
    assert not surface.unknown, (
        f"torch {torch.__version__} has switches the catalogue does not know: {surface.unknown}"
    )
    assert len(surface.managed) > 100
    assert "_set_cudnn_benchmark" in surface.managed
    assert "torch.__future__.set_swap_module_params_on_conversion" in surface.managed
    assert surface.managed["torch._inductor.config.deterministic"] == "inductor.deterministic"
    assert "torch._inductor.config.max_autotune" in surface.not_state


@pytest.mark.parametrize("path", LISTS, ids=[p.stem for p in LISTS])
def test_wheel_name_list_has_no_unknown_switch(path: Path) -> None:
    names = name_list(path)
    assert len(names) > 400
    surface = classify(names, _known_rows())
    assert not surface.unknown, f"{path.name}: unknown switches {surface.unknown}"


def test_the_215_switches_are_managed_rows() -> None:
    names = name_list(next(p for p in LISTS if "2.15" in p.name))
    surface = classify(names, _known_rows())
    for name, row in (
        ("_get_fa4_sdp_enabled", "sdp.fa4"),
        ("_get_native_aot_enabled", "native_aot.enabled"),
        ("_get_native_aot_unconditional_masked", "native_aot.unconditional_masked"),
    ):
        assert surface.managed[name] == row


def test_an_unlisted_name_is_reported_by_name() -> None:
    surface = classify([*name_list(LISTS[-1]), "_get_brand_new_switch"], _known_rows())
    assert surface.unknown == ["_get_brand_new_switch"]


#: Rows whose switch only a newer torch's Python API has (TunableOp's algo count 2.14 and
#: wildcard fallback 2.15, the helion DSL 2.14, inductor's ``numerics``): the name lists
#: hold ``torch._C`` names only, so on an older torch no discovery names them.
NEWER_PYTHON_ONLY = {
    "tunableop.cublaslt_requested_algo_count",
    "tunableop.wildcard_fallback",
    "python_native.helion.enabled",
    "inductor.numerics",
    # no one switch: any attribute a test sets on a torch.backends module
    "backends.module_attributes",
}


def _catalogue_rows() -> set[str]:
    # per-device copies of a row (cufft_plan_cache[1], ...) and the runtime net are not rows
    # of the table; the first device's row stands for them
    return {n for n in _known_rows() if "[" not in n or "[0]" in n} - {
        n for n in _known_rows() if n.startswith("torch._C.")
    }


@functools.cache
def _whole_surface() -> tuple[list[str], dict[str, str]]:
    """Every name discovery finds (here, with the compiler config imported, and in the
    name lists), and the row that manages each managed one."""
    import torch._inductor.config  # its numerics options are rows

    names = sorted({n for p in LISTS for n in name_list(p)} | set(discover(torch)))
    return names, classify(names, _known_rows()).managed


def test_every_row_manages_a_discovered_switch() -> None:
    _names, managed = _whole_surface()
    by_row: dict[str, list[str]] = {}
    for name, row in managed.items():
        by_row.setdefault(row, []).append(name)
    bare = sorted(_catalogue_rows() - set(by_row))
    assert set(bare) <= NEWER_PYTHON_ONLY, f"rows no discovered switch belongs to: {bare}"


def test_removing_any_row_names_the_switch_it_managed() -> None:
    """Each catalogue row in turn is taken out: the switches it managed become unknown, by name."""
    _names, managed = _whole_surface()
    known = _known_rows()
    rows = sorted(_catalogue_rows())
    assert len(rows) > 150
    checked = 0
    for row in rows:
        expected = sorted(n for n, r in managed.items() if r == row)
        if not expected:
            assert row in NEWER_PYTHON_ONLY, f"no discovered switch is managed by {row!r}"
            continue
        checked += 1
        surface = classify(expected, known - {row})
        assert not surface.managed, (row, surface.managed)
        named = {u.split(" ")[0] for u in surface.unknown}
        assert named == set(expected), (row, surface.unknown, surface.not_state)
        declared = [n for n in expected if declared_row(n) == row]
        assert all(f"{n} (row {row!r} is missing)" in surface.unknown for n in declared), row
    assert checked >= len(rows) - len(NEWER_PYTHON_ONLY)


def test_every_not_state_entry_has_a_reason() -> None:
    surface = classify(discover(torch), _known_rows())
    assert surface.not_state
    assert all(len(reason) > 20 for reason in surface.not_state.values())


class _FakeC(types.ModuleType):
    """torch._C with an extra getter/setter pair the catalogue does not know."""

    def __init__(self, real: Any) -> None:
        super().__init__("torch._C")
        self._real = real
        self.value = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __dir__(self) -> list[str]:
        return [*dir(self._real), "_get_brand_new_switch", "_set_brand_new_switch"]

    def _get_brand_new_switch(self) -> bool:
        return self.value

    def _set_brand_new_switch(self, value: bool) -> None:
        self.value = value


class _FakeTorch(types.ModuleType):
    def __init__(self, C: Any) -> None:
        super().__init__("torch")
        self._C = C

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def test_runtime_net_reports_an_unmanaged_switch_and_leaves_it() -> None:
    fake_c = _FakeC(torch._C)
    fake = _FakeTorch(fake_c)
    rows, absent = build_catalogue(fake)
    reg = FlagRegistry(fake, rows, absent)
    row = reg.by_name["torch._C._get_brand_new_switch"]
    assert row.unmanaged
    before = reg.snapshot()
    fake_c.value = True
    after = reg.snapshot()
    assert reg.diff(before, after) == {"torch._C._get_brand_new_switch": (False, True)}
    reg.restore(before)  # never written: unknown to the plugin
    assert fake_c.value is True


def test_runtime_net_message_names_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_backends.isolation import snapshot

    fake_c = _FakeC(torch._C)
    fake = _FakeTorch(fake_c)
    reg = FlagRegistry(fake, *build_catalogue(fake))
    monkeypatch.setattr(snapshot, "registry", lambda: reg)
    text = snapshot.diff_lines({"torch._C._get_brand_new_switch": (False, True)})
    assert (
        "changed an unmanaged switch `torch._C._get_brand_new_switch` "
        "(not restored: unknown to the plugin)" in text
    )


def test_interop_threads_are_reported_unrestorable_with_what_to_do() -> None:
    from pytest_backends.isolation.snapshot import diff_lines

    text = diff_lines({"num_interop_threads": (4, 1)})
    assert "cannot be restored" in text and "conftest.py" in text
    reg = registry()
    with pytest.raises(RuntimeError, match="num_interop_threads cannot be restored"):
        reg.restore(
            {**reg.snapshot(), "num_interop_threads": reg.snapshot()["num_interop_threads"] + 1}
        )


def test_inference_mode_is_restored_so_backward_works() -> None:
    reg = registry()
    before = reg.snapshot()
    ctx = torch.inference_mode()
    ctx.__enter__()
    try:
        assert reg.diff(before, reg.snapshot())["autograd.inference_mode"] == (False, True)
        reg.restore(before)
        assert reg.snapshot() == before
        x = torch.ones(3, requires_grad=True)
        (x * x).sum().backward()
        assert x.grad is not None and x.grad.tolist() == [2.0, 2.0, 2.0]
    finally:
        ctx.__exit__(None, None, None)


class _Native:
    """A stand-in for torch 2.15's torch._native (AOT kernels and their mask)."""

    def __init__(self) -> None:
        self.aot, self.masked, self.rebuilt = True, False, 0

    def set_aot_enabled(self, value: bool) -> None:
        self.aot = value

    def _set_mask_unconditional(self, value: bool) -> None:
        self.masked = value
        self.rebuilt += 1  # the registry rebuilds every router


def test_215_rows_on_fakes_set_then_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """sdp.fa4 and the native AOT rows, on a torch._C carrying the 2.15 names."""
    names215 = set(name_list(next(p for p in LISTS if "2.15" in p.name)))
    state = {"fa4": False}
    native = _Native()
    extra = {
        "_get_fa4_sdp_enabled": lambda: state["fa4"],
        "_set_sdp_use_fa4": lambda v: state.__setitem__("fa4", v),
        "_get_native_aot_enabled": lambda: native.aot,
        "_set_native_aot_enabled": native.set_aot_enabled,
        "_get_native_aot_unconditional_masked": lambda: native.masked,
        "_set_native_aot_unconditional_masked": lambda v: setattr(native, "masked", v),
    }
    assert set(extra) <= names215

    class C215(_FakeC):
        def __getattr__(self, name: str) -> Any:
            return extra[name] if name in extra else getattr(self._real, name)

    fake = _FakeTorch(C215(torch._C))
    module = types.ModuleType("torch._native")
    module.set_aot_enabled = native.set_aot_enabled  # type: ignore[attr-defined]
    registry_mod = types.ModuleType("torch._native.registry")
    registry_mod._set_mask_unconditional = native._set_mask_unconditional  # type: ignore[attr-defined]
    module.registry = registry_mod  # type: ignore[attr-defined]
    monkeypatch.setitem(__import__("sys").modules, "torch._native", module)
    monkeypatch.setitem(__import__("sys").modules, "torch._native.registry", registry_mod)
    reg = FlagRegistry(fake, *build_catalogue(fake))
    before = reg.snapshot()
    for name, value in (
        ("sdp.fa4", True),
        ("native_aot.enabled", False),
        ("native_aot.unconditional_masked", True),
    ):
        reg.apply(reg.validate({name: value}))
        assert reg.snapshot()[name] is value
    reg.restore(before)
    assert reg.snapshot() == before
    assert (state["fa4"], native.aot, native.masked) == (False, True, False)
    assert native.rebuilt == 2  # the mask went through the registry function both ways


def test_corrected_versions_and_blas_names() -> None:
    reg = registry()
    if "cuda.cublas_workspace_size" in reg.absent and torch.cuda.is_available():
        assert "2.14" not in reg.absent["cuda.cublas_workspace_size"]
    row = reg.by_name["cuda.preferred_blas_library"]
    assert row.check("hipblaslt") == "cublaslt"
    assert row.check("hipblas") == "cublas"
    assert row.check("default") in ("cublas", "cublaslt", "ck")
    native = reg.by_name.get("python_native.triton.enabled")
    if native is not None:  # where the running torch has torch.backends.python_native
        assert "torch.backends.python_native.triton.enabled" in native.doc, native.doc


def test_generated_switch_reference_matches_the_catalogue() -> None:
    from pytest_backends.flags.reference import render

    page = Path(__file__).resolve().parents[2] / "docs" / "reference" / "switches.rst"
    reg = registry()
    assert page.read_text() == render([*reg.names(), *reg.absent]), (
        "regenerate it: python -m pytest_backends.flags.reference > docs/reference/switches.rst"
    )


def test_a_pair_row_with_an_absence_reason_is_added_where_the_pair_exists() -> None:
    """``absent=`` is the reason when the pair is missing, never a keyword of the row.

    TunableOp's rows pass one ("needs a CUDA device"), and on a machine with a GPU,
    where the pair exists, it reached the row's constructor: the registry could not
    be built and every session ended in an INTERNALERROR.
    """
    from pytest_backends.flags.switch_state import pair_row

    class Owner:
        value = 3

        def get_value(self) -> int:
            return self.value

        def set_value(self, value: int) -> None:
            self.value = value

    rows: dict[str, tuple[object, ...]] = {}

    def add(name: str, exists: object, *rest: object, **extra: object) -> None:
        rows[name] = (exists, *rest, extra)

    owner = Owner()
    pair_row(add, "x.value", owner, "get_value", "set_value", "doc", absent="needs a GPU")
    pair_row(add, "x.gone", owner, "get_gone", "set_gone", "doc", absent="needs a GPU")
    exists, read, *_, extra = rows["x.value"]
    assert exists is True and extra == {} and read() == 3  # type: ignore[operator]
    assert rows["x.gone"][0] == "needs a GPU"


def test_a_logging_setter_of_an_older_torch_is_no_unknown_switch() -> None:
    # torch 2.11 defines torch.set_vital (a usage log); later torch only warns it is deprecated
    surface = classify(["torch.set_vital", "_set_vital", "_set_cudnn_benchmark"], _known_rows())
    assert surface.unknown == []
    assert "torch.set_vital" in surface.not_state and "_set_vital" in surface.not_state
