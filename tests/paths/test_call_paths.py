"""Where two paths part in the user's code: the call only one path made, or the value it made.

An op's call site is its path through the user's code, so a helper's extra
call is that call; a tensor made from a flag's value is named at the op that
got it. The oracle is the program itself: the corpus writes small programs
some of whose statements call helpers only while oneDNN is enabled, or make
tensors from the flag, so where the paths part is known before they run.
``PATHS_CORPUS_EXAMPLES`` raises the example count, as for the other paths
corpus.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from paths_corpus import check_counts, corpus

from pytest_backends import PathsDisagreeError, assert_paths_agree
from pytest_backends.paths.api import _run
from pytest_backends.paths.branches import path_difference

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)

COUNTS = {"programs": 0, "branched": 0, "disagreements": 0}


def _on() -> int:
    return int(torch.backends.mkldnn.enabled)


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0  # HELPER-OP


def _twice_removed(x: torch.Tensor) -> torch.Tensor:
    return _double(x)  # NESTED-CALL


def _line(marker: str) -> str:
    text = Path(__file__).read_text().splitlines()
    return f"{__file__}:{next(i for i, t in enumerate(text, 1) if t.endswith(marker))}"


def _extra_first_call(x: torch.Tensor) -> torch.Tensor:
    y = _double(x)
    if _on():
        y = _double(y)  # EXTRA-CALL
    return _double(y)


def _nested_extra_call(x: torch.Tensor) -> torch.Tensor:
    y = _twice_removed(x)
    if _on():
        y = _twice_removed(y)  # NESTED-EXTRA
    return _twice_removed(y)


def _extra_loop_turn(x: torch.Tensor) -> torch.Tensor:
    for _ in range(2 + _on()):
        x = _double(x)  # LOOP-CALL
    return _double(x)


@pytest.mark.parametrize(
    ("fn", "site", "occurrence"),
    [
        (_extra_first_call, "{op} (called from {extra})", 0),
        (_nested_extra_call, "{op} (called from {nested}, from {nested_extra})", 0),
        (_extra_loop_turn, "{op} (called from {loop})", 2),
    ],
    ids=["extra call before the others", "through a helper's helper", "one loop turn more"],
)
def test_the_call_only_one_path_made_is_named(fn: Any, site: str, occurrence: int) -> None:
    """Not the helper's last call: the call the branch made, with the lines that led to it."""
    expected = site.format(
        op=_line("# HELPER-OP"),
        extra=_line("# EXTRA-CALL"),
        nested=_line("# NESTED-CALL"),
        nested_extra=_line("# NESTED-EXTRA"),
        loop=_line("# LOOP-CALL"),
    )
    with pytest.raises(PathsDisagreeError) as info:
        assert_paths_agree(fn, torch.ones(3), axes=["mkldnn"], backward=False)
    assert (
        f"aten::mul at {expected} ran under mkldnn-on only: the paths ran different ops, so "
        f"the code branches on a flag in Python (occurrence {occurrence} of that op"
    ) in str(info.value), str(info.value)


def test_the_callers_stop_at_the_call_of_the_users_code() -> None:
    """Neither this package's frames nor pytest's (nor the test calling the API) are callers."""
    ref = _run(_extra_first_call, (torch.ones(3),), "a", {}, "cpu", False)
    sites = {r.site for r in ref.records}
    calls = (_line("y = _double(x)"), _line("# EXTRA-CALL"), _line("return _double(y)"))
    assert sites == {f"{_line('# HELPER-OP')} (called from {call})" for call in calls}, sites
    assert not any("_pytest" in s or "pluggy" in s or "pytest_backends" in s for s in sites)


def test_pythons_own_library_is_left_out_of_the_callers() -> None:
    """A TestCase method run by unittest's runner: its frames are no caller, the user's are."""
    import io
    import unittest

    from pytest_backends.paths.record import PathRecorder, module_tracking

    sites: list[str] = []

    class Case(unittest.TestCase):
        def test_it(self) -> None:
            x = torch.ones(3)
            with module_tracking() as modules, PathRecorder(modules) as recorder:
                _double(x)  # IN-TESTCASE
            sites.extend(r.site for r in recorder.records)

    suite = unittest.defaultTestLoader.loadTestsFromTestCase(Case)
    outcome = unittest.TextTestRunner(stream=io.StringIO()).run(suite)  # UNITTEST-RUN
    assert outcome.wasSuccessful(), outcome.errors
    callers = f"{_line('# IN-TESTCASE')}, from {_line('# UNITTEST-RUN')}"
    assert sites == [f"{_line('# HELPER-OP')} (called from {callers})"], sites


def test_a_trace_of_the_earlier_format_is_refused(tmp_path: Path) -> None:
    """Format 1 identities never pair with format 2's: comparing them would blame every op."""
    from pytest_backends.paths.trace import FORMAT, Trace

    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"format": 1, "test": "t", "config": "c"}) + "\n")
    with pytest.raises(
        ValueError,
        match=rf"old\.jsonl: a pytest-backends trace of format 1, "
        rf"not {FORMAT}: record it again",
    ):
        Trace.load(old)


# -- the corpus -------------------------------------------------------------------------

#: (helper, guard, turns): guard "" runs on both paths, "if" only with oneDNN on,
#: "loop" one turn more with oneDNN on; "value" multiplies by a tensor made from the
#: flag, "same" by one made from a constant (no helper call for either); "step" takes an
#: optimizer step on a global model and a Python random draw, which every configuration's
#: run must start from alike.
Statement = tuple[str, str, int]

PRELUDE = """\
import random

import torch

lin = torch.nn.Linear(3, 3)
opt = torch.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)


def train(x):
    opt.zero_grad()
    lin(x).pow(2).sum().backward()
    opt.step()
    return lin.weight.sum().detach()


def on():
    return int(torch.backends.mkldnn.enabled)


def double(x):
    return x * 2.0


def via(x):
    return double(x)


def fn(x):
"""


def _program(statements: list[Statement]) -> tuple[str, dict[str, int]]:
    """The source of ``fn`` and the line numbers of its helpers' and statements' calls."""
    lines = PRELUDE.splitlines()
    where = {
        "double": next(i for i, t in enumerate(lines, 1) if "x * 2.0" in t),
        "via": next(i for i, t in enumerate(lines, 1) if "return double(x)" in t),
    }
    for k, (helper, guard, turns) in enumerate(statements):
        call = f"x = {helper}(x)"
        if guard == "step":  # state fn reads and changes, and a Python draw: no branch
            lines.append("    x = x + train(x.detach()) * 0.0 + random.random()")
        elif guard == "value":  # a tensor made from the flag's value: no op of the run made it
            lines.append(f"    x = x * torch.tensor(1.0 + on() * {turns})")
        elif guard == "same":  # a tensor made from Python values the same on both paths
            lines.append(f"    x = x * torch.tensor({turns}.0)")
        elif guard == "if":
            lines.append(f"    if on(): {call}")
        elif guard == "loop":
            lines.append(f"    for _ in range({turns} + on()): {call}")
        else:
            lines.append(f"    for _ in range({turns}): {call}")
        where[f"s{k}"] = len(lines)
    lines.append("    return x")
    return "\n".join(lines) + "\n", where


def _expected(statements: list[Statement], where: dict[str, int], name: str) -> str | None:
    """Where the paths part, from the program: the first call only oneDNN's path makes."""
    for k, (helper, guard, turns) in enumerate(statements):
        if guard in ("", "same", "step"):
            continue
        if guard == "value":
            return (
                f"aten::lift_fresh at {name}:{where[f's{k}']} got another tensor input 0 under "
                "mkldnn-off than under mkldnn-on, and no op of the run made it"
            )
        chain = [f"{name}:{where['double']}"]
        if helper == "via":
            chain.append(f"{name}:{where['via']}")
        chain.append(f"{name}:{where[f's{k}']}")
        occurrence = 0 if guard == "if" else turns
        site = f"{chain[0]} (called from {', from '.join(chain[1:])})"
        return f"aten::mul at {site} ran under mkldnn-on only: the paths ran different ops, " + (
            f"so the code branches on a flag in Python (occurrence {occurrence} of that op"
        )
    return None


@corpus
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["double", "via"]),
            st.sampled_from(["", "", "same", "step", "if", "loop", "value"]),
            st.integers(1, 3),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_branch_named_is_the_programs(statements: list[Statement]) -> None:
    """On generated helper-call programs, the named op is the one the program branches to."""
    name = f"/corpus/program_{len(statements)}.py"
    source, where = _program(statements)
    namespace: dict[str, Any] = {}
    exec(compile(source, name, "exec"), namespace)
    expected = _expected(statements, where, name)
    COUNTS["programs"] += 1
    try:
        assert_paths_agree(namespace["fn"], torch.ones(3), axes=["mkldnn"], backward=False)
        told = None
    except PathsDisagreeError as exc:
        told = str(exc)
    agreed = told is None if expected is None else told is not None and expected in told
    COUNTS["branched"] += expected is not None
    COUNTS["disagreements"] += not agreed
    assert agreed, (source, expected, told)


def test_the_branch_named_without_a_failure() -> None:
    """``path_difference`` names the branch even where the results happen to agree."""
    source, where = _program([("double", "if", 1), ("double", "", 1)])
    name = "/corpus/same_result.py"
    namespace: dict[str, Any] = {}
    exec(compile(source.replace("x * 2.0", "x * 1.0"), name, "exec"), namespace)
    on = _run(
        namespace["fn"], (torch.ones(3),), "mkldnn-on", {"mkldnn.enabled": True}, "cpu", False
    )
    off = _run(
        namespace["fn"], (torch.ones(3),), "mkldnn-off", {"mkldnn.enabled": False}, "cpu", False
    )
    told = path_difference(on, off)
    assert told is not None and re.search(
        rf"at {re.escape(name)}:{where['double']} \(called from {re.escape(name)}:{where['s0']}\)",
        told,
    ), told


def test_corpus_counts() -> None:
    """Runs after the corpus (file order): report the counts."""
    check_counts("call-path", COUNTS, "programs", "branched")
