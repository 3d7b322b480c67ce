"""Binding @pytest.mark.backends arguments through the marker's own signature."""

from __future__ import annotations

import inspect

import pytest

from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.markers import MarkerError, backends, bind, marker_line, resolve

REG = builtin_registry()


def test_positional_axes_and_keyword_values() -> None:
    spec = backends("mkldnn", sdpa=["math", "flash"], device="cpu")
    assert spec.axes == (("mkldnn", None), ("sdpa", ("math", "flash")), ("device", ("cpu",)))


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((1,), {}, r"axis names are strings, got 1 \(int\)"),
        ((), {"sdpa": []}, r"sdpa=\[\] selects no value"),
        ((), {"mkldnn": True}, r"mkldnn=True: values are a string or a list of strings"),
        (("mkldnn",), {"mkldnn": "on"}, "axis 'mkldnn' is given twice"),
        ((), {"mkldnn": ["on", "on"]}, r"axis 'mkldnn' lists value 'on' more than once"),
        (
            (),
            {"cpu_capability": ("avx2", "avx2", "avx2", "default")},
            r"lists value 'avx2' more than once: name each value once, "
            r"backends\(cpu_capability=\['avx2', 'default'\]\)",
        ),
    ],
)
def test_bad_arguments(args: tuple[object, ...], kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(MarkerError, match=message):
        bind(args, kwargs)


def test_resolve_validates_names_with_suggestions() -> None:
    with pytest.raises(
        MarkerError,
        match=r"unknown axis 'mkldn' \(did you mean 'mkldnn'\?\); "
        r"valid axes: cudnn, cudnn_benchmark, mkldnn, ",
    ):
        resolve([(("mkldn",), {})], REG)
    with pytest.raises(
        MarkerError,
        match=r"axis 'sdpa' has no value 'flsh' \(did you mean "
        r"'flash'\?\); valid values: math, flash, efficient",
    ):
        resolve([((), {"sdpa": "flsh"})], REG)


def test_resolve_merges_levels_closest_first_in_registry_order() -> None:
    function_mark = ((), {"mkldnn": "off"})
    class_mark = (("mkldnn", "sdpa"), {})
    module_mark = ((), {"device": ["cuda", "cpu"]})
    assert resolve([function_mark, class_mark, module_mark], REG) == {
        "mkldnn": ("off",),
        "sdpa": ("math", "flash", "efficient", "cudnn"),
        "device": ("cpu", "cuda"),
    }


def test_marker_line_is_built_from_the_signature() -> None:
    params = list(inspect.signature(backends).parameters)
    assert marker_line().startswith(f"backends(*{params[0]}, **{params[1]}): ")
