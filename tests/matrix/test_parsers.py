"""The option parsers: pure functions that raise pytest.UsageError on bad input."""

from __future__ import annotations

import pytest

from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.settings import (
    check_axes,
    check_config_ids,
    parse_config_ids,
    parse_matrix,
    parse_sample,
    parse_seed,
    parse_verify,
)

SRC = "--opt"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", (False, None)),
        ("off", (False, None)),
        ("OFF", (False, None)),
        ("all", (True, None)),
        ("on", (True, None)),
        ("mkldnn", (True, ("mkldnn",))),
        (" mkldnn , device ", (True, ("mkldnn", "device"))),
        ("mkldnn,mkldnn", (True, ("mkldnn",))),
    ],
)
def test_parse_matrix(value: str, expected: tuple[bool, tuple[str, ...] | None]) -> None:
    assert parse_matrix(value, SRC) == expected


@pytest.mark.parametrize("value", ["mkldnn,", "mk-ldnn", "1x", "mkldnn;device"])
def test_parse_matrix_rejects_bad_names(value: str) -> None:
    with pytest.raises(pytest.UsageError, match=r"--opt: .* is not an axis name"):
        parse_matrix(value, SRC)


def test_parse_matrix_hints_at_a_swallowed_path() -> None:
    with pytest.raises(pytest.UsageError, match=r"looks like a path.*--backends-matrix=VALUE"):
        parse_matrix("tests/test_x.py", SRC)


def test_check_axes_lists_valid_axes() -> None:
    registry = builtin_registry()
    check_axes(("mkldnn", "device"), registry, SRC)
    with pytest.raises(pytest.UsageError, match=r"unknown axis 'mkldn'; valid axes: cudnn, "):
        check_axes(("mkldn",), registry, SRC)


@pytest.mark.parametrize(("value", "expected"), [("", None), (" 4 ", 4), ("1", 1)])
def test_parse_sample(value: str, expected: int | None) -> None:
    assert parse_sample(value, SRC) == expected


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_parse_sample_rejects(value: str) -> None:
    with pytest.raises(pytest.UsageError, match="expected a positive integer"):
        parse_sample(value, SRC)


@pytest.mark.parametrize(("value", "expected"), [("", None), ("0", 0), ("123", 123), ("0x10", 16)])
def test_parse_seed(value: str, expected: int | None) -> None:
    assert parse_seed(value, SRC) == expected


@pytest.mark.parametrize("value", ["-1", "seed"])
def test_parse_seed_rejects(value: str) -> None:
    with pytest.raises(pytest.UsageError, match="non-negative integer"):
        parse_seed(value, SRC)


def test_parse_config_ids_splits_tokens() -> None:
    assert parse_config_ids(["mkldnn-off", "cudnn-on,sdpa-math"], SRC) == (
        ("mkldnn-off",),
        ("cudnn-on", "sdpa-math"),
    )


@pytest.mark.parametrize("value", ["mkldnn", "mkldnn-off,", "-off", "Mkldnn-off"])
def test_parse_config_ids_rejects(value: str) -> None:
    with pytest.raises(pytest.UsageError, match="is not a configuration token"):
        parse_config_ids([value], SRC)


def test_check_config_ids_resolves_and_lists_tokens() -> None:
    registry = builtin_registry()
    assert check_config_ids([("cap-avx2", "mkldnn-off")], registry, SRC) == (
        frozenset({("cpu_capability", "avx2"), ("mkldnn", "off")}),
    )
    with pytest.raises(pytest.UsageError, match=r"'mkldnn-of'.*valid tokens: cudnn-on, cudnn-off"):
        check_config_ids([("mkldnn-of",)], registry, SRC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("on", "on"), ("", "off"), ("off", "off"), ("strict", "strict"), ("STRICT", "strict")],
)
def test_parse_verify(value: str, expected: str) -> None:
    assert parse_verify(value, SRC) == expected


def test_parse_verify_rejects() -> None:
    with pytest.raises(pytest.UsageError, match="expected one of off, on, strict"):
        parse_verify("hard", SRC)
