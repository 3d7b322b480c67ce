"""TunableOp's rows: only on builds with a usable CUDA or ROCm device."""

from __future__ import annotations

import contextlib
import functools
import importlib
from typing import Any

from pytest_backends.flags.row import Invalid, check_bool, missing_flag, non_negative_int
from pytest_backends.flags.switch_state import Add, any_value, get_attr, pair_row, str_or_none

__all__ = ["rotating_buffer_check", "rotating_buffer_write", "tunable_rows"]


def tunable_rows(torch: Any, add: Add, cuda_ready: bool) -> None:
    """TunableOp's switches, absent (with the reason) without a CUDA device."""
    need = "needs a CUDA device (TunableOp)"
    tunable: Any = None
    if cuda_ready:
        with contextlib.suppress(Exception):
            tunable = importlib.import_module("torch.cuda.tunable")
    for name, getter, setter, check, allowed in (
        ("enabled", "is_enabled", "enable", check_bool, "True, False"),
        ("tuning", "tuning_is_enabled", "tuning_enable", check_bool, "True, False"),
        (
            "record_untuned",
            "record_untuned_is_enabled",
            "record_untuned_enable",
            check_bool,
            "True, False",
        ),
        (
            "max_tuning_duration",
            "get_max_tuning_duration",
            "set_max_tuning_duration",
            non_negative_int,
            "milliseconds",
        ),
        (
            "max_tuning_iterations",
            "get_max_tuning_iterations",
            "set_max_tuning_iterations",
            non_negative_int,
            "an int",
        ),
        (
            "cublaslt_requested_algo_count",
            "get_cublaslt_requested_algo_count",
            "set_cublaslt_requested_algo_count",
            non_negative_int,
            "an int",
        ),
        (
            "wildcard_fallback",
            "wildcard_fallback_is_enabled",
            "wildcard_fallback_enable",
            check_bool,
            "True, False",
        ),
    ):
        pair_row(
            add,
            f"tunableop.{name}",
            tunable,
            getter,
            setter,
            f"torch.cuda.tunable.{setter}",
            check=check,
            allowed=allowed,
            absent=need,
        )
    exists = tunable is not None and hasattr(tunable, "get_rotating_buffer_size")
    add(
        "tunableop.rotating_buffer_size",
        (exists and hasattr(tunable, "set_rotating_buffer_size")) or need,
        get_attr(tunable, "get_rotating_buffer_size") or missing_flag,
        functools.partial(rotating_buffer_write, tunable),
        rotating_buffer_check,
        "bytes, as get_rotating_buffer_size() reports (whole MB, or the L2 cache size)",
        "torch.cuda.tunable.set_rotating_buffer_size",
    )
    add(
        "tunableop.filename",
        (tunable is not None and hasattr(tunable, "get_filename")) or need,
        get_attr(tunable, "get_filename") or missing_flag,
        functools.partial(tunable_filename_write, tunable),
        str_or_none,
        "a file name",
        "torch.cuda.tunable.set_filename",
    )
    add(
        "tunableop.results",
        (tunable is not None and hasattr(tunable, "get_results")) or need,
        lambda: tuple(tunable.get_results()) if tunable is not None else (),
        functools.partial(_tunable_results_write, tunable),
        any_value,
        "the tuned results (cleared on restore)",
        "TunableOp's in-memory results: a test that tunes changes later tests' kernels",
    )


def _tunable_results_write(tunable: Any, value: object) -> None:
    clear = getattr(tunable, "_clear_all", None)
    if clear is None:
        raise RuntimeError("this torch cannot clear TunableOp results (needs torch >= 2.15)")
    clear()


_MIB = 1 << 20


def rotating_buffer_check(value: object) -> object:
    """Check a TunableOp rotating buffer size: an int, as the getter reports it."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise Invalid(f"expected an int (bytes, as get_rotating_buffer_size() reports), got {value!r}")


def rotating_buffer_write(tunable: Any, value: int) -> None:
    """Set TunableOp's rotating buffer so that its getter reports ``value`` again.

    Newer torch takes megabytes and reports bytes (a negative size meaning
    the L2 cache size, reported as that size); older torch takes and
    reports the same number. Writing a read value back unchanged would, on
    the newer, ask for a million times the buffer (and overflow torch's
    int), so the setter's unit is found by writing 1 and reading it back.
    """
    get, put = tunable.get_rotating_buffer_size, tunable.set_rotating_buffer_size
    if get() == value:  # also where PYTORCH_TUNABLEOP_ROTATING_BUFFER_SIZE decides the value
        return
    put(1)
    scale = _MIB if get() == _MIB else 1
    if value < 0 or value % scale == 0:
        put(value // scale if value >= 0 else value)
    else:
        put(-1)  # the L2 cache size, which need not be whole megabytes
    if get() != value:
        raise ValueError(
            f"TunableOp's rotating buffer cannot be set to {value} bytes here (it is set "
            "in whole megabytes, or -1 for the L2 cache size)"
        )


def tunable_filename_write(tunable: Any, value: str) -> None:
    """Set TunableOp's results file name (without the device suffix)."""
    tunable.set_filename(value, False)
