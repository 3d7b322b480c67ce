"""Hostile marker arguments and option values: a valid parametrization or a clear error.

The hypothesis tests drive the same functions the plugin calls during
collection (marker binding, resolution, expansion, config building) and
every option parser; the pytester runs check the end-to-end promise that no
input turns into an INTERNALERROR and that the rest of the suite still runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_backends import isolation
from pytest_backends.capability import levels as capability
from pytest_backends.matrix import expand as matrix_expand
from pytest_backends.matrix import markers
from pytest_backends.matrix import settings as matrix
from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.configs import ConfigError

pytest_plugins = ["pytester"]

REGISTRY = builtin_registry()
AXES = list(REGISTRY.names)
VALUES = sorted({v for axis in REGISTRY for v in axis.value_names})

junk = st.one_of(
    st.none(),
    st.integers(),
    st.floats(allow_nan=True),
    st.booleans(),
    st.binary(max_size=4),
    st.text(max_size=12),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
axis_name = st.one_of(st.sampled_from(AXES), st.text(max_size=10), junk)
value_name = st.one_of(st.sampled_from(VALUES), st.text(max_size=8), junk)
value_spec = st.one_of(
    value_name,
    st.lists(value_name, max_size=6),  # includes empty lists and duplicates
    st.tuples(value_name, value_name),
    st.lists(st.lists(value_name, max_size=2), max_size=2),
)
marker_args = st.tuples(
    st.lists(axis_name, max_size=12),
    st.dictionaries(
        st.one_of(st.sampled_from(AXES), st.text(max_size=10)), value_spec, max_size=12
    ),
)
# A test, its class and its module may each carry a marker.
marker_stack = st.lists(marker_args, min_size=1, max_size=3)

MATRIX_SETTINGS = [
    matrix.MatrixSettings(enabled=True),
    matrix.MatrixSettings(enabled=True, sample=3, seed=7),
    matrix.MatrixSettings(enabled=True, axes=("mkldnn", "device", "cpu_capability")),
]


def _expand(
    marks: Sequence[tuple[Sequence[object], Mapping[str, object]]],
    settings: matrix.MatrixSettings,
) -> list[str]:
    """What collection does with these markers: config ids, or a MarkerError/ConfigError."""
    selection = markers.resolve(marks, REGISTRY)
    combos = matrix_expand.expand(selection, REGISTRY, settings, "test_x.py::test_fuzz")
    configs = [REGISTRY.make(c, available_flags=frozenset(), cuda_available=False) for c in combos]
    return [c.id for c in configs]


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(stack=marker_stack, which=st.integers(0, len(MATRIX_SETTINGS) - 1))
def test_marker_arguments_never_crash(
    stack: list[tuple[list[Any], dict[str, Any]]], which: int
) -> None:
    marks = [(tuple(args), kwargs) for args, kwargs in stack]
    try:
        ids = _expand(marks, MATRIX_SETTINGS[which])
    except (markers.MarkerError, ConfigError) as exc:
        message = str(exc)
        assert message and "Traceback" not in message
        return
    # a valid parametrization: unique, stable ids made of known tokens
    assert len(ids) == len(set(ids))
    assert ids == _expand(marks, MATRIX_SETTINGS[which])
    for config_id in ids:
        for token in config_id.split(","):
            REGISTRY.parse_token(token)
    assert len(ids) <= matrix_expand.MAX_CONFIGS or MATRIX_SETTINGS[which].sample is not None


def test_huge_products_are_refused_with_advice() -> None:
    everything = [((), {axis: list(REGISTRY.axis(axis).value_names) for axis in AXES})]
    size = math.prod(len(REGISTRY.axis(axis).value_names) for axis in AXES)
    assert size > matrix_expand.MAX_CONFIGS
    with pytest.raises(ConfigError, match=r"expands to \d+ configurations.*--backends-sample"):
        _expand(everything, matrix.MatrixSettings(enabled=True))
    sampled = _expand(everything, matrix.MatrixSettings(enabled=True, sample=5, seed=1))
    assert len(sampled) == 5


PARSERS = [
    lambda v: matrix.parse_matrix(v, "--backends-matrix"),
    lambda v: matrix.parse_sample(v, "--backends-sample"),
    lambda v: matrix.parse_seed(v, "--backends-seed"),
    lambda v: matrix.check_config_ids(
        matrix.parse_config_ids([v], "--backends-config"), REGISTRY, "--backends-config"
    ),
    lambda v: matrix.parse_verify(v, "--backends-verify"),
    lambda v: isolation.parse_leak_mode(v, "--backends-leaks"),
    lambda v: capability.parse_levels(v, "--backends-cpu-capability"),
]


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    which=st.integers(0, len(PARSERS) - 1),
    value=st.one_of(
        st.text(max_size=30),
        st.sampled_from(
            [
                "all",
                "off",
                "on",
                "strict",
                "0",
                "-1",
                "1e9",
                "mkldnn,,",
                "cap-avx2",
                "mkldnn-off,sdpa-math",
                "default,avx2,avx512",
                "sve256",
                " ",
            ]
        ),
    ),
)
def test_option_values_never_crash(which: int, value: str) -> None:
    try:
        PARSERS[which](value)
    except pytest.UsageError as exc:
        assert str(exc).startswith("--backends-")
        assert repr(value)[1:-1][:10] in str(exc) or value.strip() == "" or "'" in str(exc)


HOSTILE_FILE = """
import pytest

@pytest.mark.backends("mkldn")
def test_typo_axis():
    pass

@pytest.mark.backends(sdpa=["math", "flsh"])
def test_typo_value():
    pass

@pytest.mark.backends(3)
def test_wrong_type():
    pass

@pytest.mark.backends(sdpa=[])
def test_empty():
    pass

@pytest.mark.backends("mkldnn", "mkldnn")
def test_duplicate_axis():
    pass

@pytest.mark.backends(mkldnn=["on", "off"], nnpack={"on": 1})
def test_dict_value():
    pass

@pytest.mark.backends(*[a for a in {axes!r}])
def test_huge_product():
    pass

@pytest.mark.backends("mkldnn")
def test_fine(backend_config):
    assert backend_config.axes["mkldnn"] in ("on", "off")

def test_plain():
    pass
"""


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_hostile_markers_end_to_end(pytester: pytest.Pytester, extra: list[str]) -> None:
    pytester.makepyfile(test_hostile=HOSTILE_FILE.replace("{axes!r}", repr(AXES)))
    result = pytester.runpytest_subprocess("-p", "no:randomly", "--backends-matrix", *extra)
    out = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in out
    outcomes = result.parseoutcomes()
    # 7 bad tests error at setup, each named; the good ones all ran
    assert outcomes.get("errors") == 7, out[-3000:]
    assert outcomes.get("passed") == 3
    for name, fragment in [
        ("test_typo_axis", "unknown axis 'mkldn'"),
        ("test_typo_value", "no value 'flsh'"),
        ("test_wrong_type", "axis names are strings"),
        ("test_empty", "selects no value"),
        ("test_duplicate_axis", "given twice"),
        ("test_dict_value", "string or a list of strings"),
        ("test_huge_product", "configurations (more than"),
    ]:
        assert any(name in line and fragment in line for line in result.outlines), (
            name,
            fragment,
            out[-3000:],
        )


@pytest.mark.parametrize(
    "option",
    [
        "--backends-matrix=mkldn",
        "--backends-sample=0",
        "--backends-seed=-3",
        "--backends-config=cudnn-maybe",
        "--backends-verify=always",
        "--backends-leaks=maybe",
        "--backends-cpu-capability=avx9000",
    ],
)
def test_bad_options_are_usage_errors(pytester: pytest.Pytester, option: str) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess(option)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert option.split("=")[0] in err and "INTERNALERROR" not in err + result.stdout.str()


def test_bad_bool_ini_values_are_usage_errors_naming_the_key(pytester: pytest.Pytester) -> None:
    # found by benchmarks/fuzz_inputs.py: pytest's "invalid truth value 'mps'" named no key
    pytester.makeini("[pytest]\nbackends_determinism_all = mps\nbackends_baseline_update = no\n")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "backends_determinism_all" in err and "'mps'" in err, err
    assert "INTERNALERROR" not in err + result.stdout.str()
