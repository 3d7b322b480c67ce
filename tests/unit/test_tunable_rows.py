"""TunableOp's rotating buffer row round-trips on both of torch's unit conventions.

The row exists only with a CUDA device, so fakes of ``torch.cuda.tunable``
model the two conventions torch has had: newer torch sets megabytes, reports
bytes and reads a negative size as the L2 cache size; older torch sets and
reports one number. Writing a read value back must give the same read,
never a size a million times larger (which overflows torch's int).
"""

from __future__ import annotations

import json

import pytest

from pytest_backends.flags.row import Invalid
from pytest_backends.flags.switch_state import rotating_buffer_check, rotating_buffer_write

MIB = 1 << 20
INT_MAX = 2**31 - 1


class MegabyteTunable:
    """Newer torch: ``SetRotatingBufferSize(size)`` stores ``size * MB``; -1 reads as L2."""

    def __init__(self, l2: int = 50 * MIB) -> None:
        self.stored, self.l2 = -1, l2

    def set_rotating_buffer_size(self, size: int) -> None:
        if not -(2**31) <= size * MIB <= INT_MAX:
            raise OverflowError(f"{size} MB overflows torch's int")
        self.stored = size * MIB

    def get_rotating_buffer_size(self) -> int:
        return self.l2 if self.stored < 0 else self.stored


class SameUnitTunable:
    """Older torch: stores the number, a negative one as 0."""

    def __init__(self) -> None:
        self.stored = 0

    def set_rotating_buffer_size(self, size: int) -> None:
        self.stored = max(size, 0)

    def get_rotating_buffer_size(self) -> int:
        return self.stored


class EnvTunable(SameUnitTunable):
    """PYTORCH_TUNABLEOP_ROTATING_BUFFER_SIZE set: the getter reports it, whatever is set."""

    def get_rotating_buffer_size(self) -> int:
        return 16 * MIB


@pytest.mark.parametrize("make", [MegabyteTunable, SameUnitTunable, EnvTunable])
@pytest.mark.parametrize("user_sets", [None, 0, 1, 8, 64, 1024])
def test_a_read_value_written_back_reads_the_same(make: type, user_sets: int | None) -> None:
    tunable = make()
    if user_sets is not None:
        tunable.set_rotating_buffer_size(user_sets)
    before = tunable.get_rotating_buffer_size()
    tunable.set_rotating_buffer_size(3)  # a test changes it
    rotating_buffer_write(tunable, before)  # the guard restores the read value
    assert tunable.get_rotating_buffer_size() == before


def test_the_l2_size_is_restored_where_it_is_not_whole_megabytes() -> None:
    tunable = MegabyteTunable(l2=40 * MIB + 4096)
    before = tunable.get_rotating_buffer_size()
    tunable.set_rotating_buffer_size(2)
    rotating_buffer_write(tunable, before)
    assert tunable.get_rotating_buffer_size() == before and tunable.stored < 0


def test_a_size_torch_cannot_hold_is_a_clear_error() -> None:
    tunable = MegabyteTunable()
    with pytest.raises(ValueError, match="whole megabytes"):
        rotating_buffer_write(tunable, 3 * MIB + 1)


def test_the_value_is_an_int() -> None:
    assert rotating_buffer_check(8 * MIB) == 8 * MIB
    for bad in (True, 1.5, "8"):
        with pytest.raises(Invalid):
            rotating_buffer_check(bad)


class LazyFileTunable:
    """torch >= 2.5: the results file is named the first time the results are asked for."""

    def __init__(self) -> None:
        self.filename = ""
        self.settled = False

    def get_filename(self) -> str:
        return self.filename

    def set_filename(self, filename: str, insert_device_ordinal: bool = False) -> None:
        self.filename = filename

    def get_results(self) -> tuple[object, ...]:
        if not self.settled:  # GetTuningResultsManager's call_once
            self.settled = True
            if not self.filename:
                self.filename = "tunableop_results0.csv"
        return ()


def test_the_filename_is_settled_before_the_first_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    import torch.cuda

    from pytest_backends.flags.switch_state import tunable_rows

    fake = LazyFileTunable()
    monkeypatch.setitem(sys.modules, "torch.cuda.tunable", fake)
    rows: dict[str, object] = {}
    extras: dict[str, dict[str, object]] = {}

    def add(name: str, present: object, read: object, *rest: object, **extra: object) -> None:
        rows[name] = read
        extras[name] = extra

    tunable_rows(torch, add, cuda_ready=True)
    read_filename = rows["tunableop.filename"]
    read_results = rows["tunableop.results"]
    assert callable(read_filename) and callable(read_results)
    first = read_filename()
    read_results()  # the guard reads every row, the results too
    assert read_filename() == first == "tunableop_results0.csv"
    # the results' plain value reads back from JSON as it was written (a tuple would not)
    plain = extras["tunableop.results"]["plain"]
    assert callable(plain)
    value = plain((("GemmTunableOp_float_NN", "nn_4_4_4", "Default", 0.01),))
    assert json.loads(json.dumps(value)) == value
