"""Suite-level batch invariance: the hooks of ``@pytest.mark.batch_invariant``.

A test marked ``@pytest.mark.batch_invariant(...)`` declares that the
functions it checks with :func:`~pytest_backends.batch.api.assert_batch_invariant`
are batch-invariant. The marker's arguments are defaults for those calls
(bound through :func:`~pytest_backends.batch.marker.batch_invariant`, whose
signature is the marker's). Inside a marked test every check also records
both runs op by op, so each op the function ran gets a verdict
(``batch_variant``, ``no_difference``, ``inconclusive``) under the test's
backend config. The verdicts travel on the test's call and teardown reports as
the property :data:`pytest_backends._shared.PROPERTY_BATCH` (so xdist loses
nothing, and JUnit XML shows them); the
controller adds them up in a :class:`~pytest_backends.batch.census.BatchCensus`,
writes them as the ``batch_invariance`` section of the census file the
determinism check wrote and, with ``--backends-batch-baseline``, fails the run
only for a batch-variant op the baseline does not accept (a marked test whose
first batch-variant op is accepted passes). A marked test that never calls
the check fails: the marker promises a check.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_backends import _shared, _xdist
from pytest_backends.batch.census import SECTION, BatchCensus, updated_baseline
from pytest_backends.batch.marker import MARKER, MarkerError, bind
from pytest_backends.determinism.census import Baseline, CensusFileError, Key, Versions

if TYPE_CHECKING:
    from pytest_backends.batch.api import BatchInvariance
    from pytest_backends.batch.locate import Finding
    from pytest_backends.batch.runs import Case, Plan
    from pytest_backends.batch.settings import Settings

__all__ = ["BatchPlugin", "TestCheck"]

#: The bound arguments of an item's ``@pytest.mark.batch_invariant`` marker.
_SPEC_KEY: pytest.StashKey[dict[str, Any]] = pytest.StashKey()


class TestCheck:
    """The batch-invariance checks of one marked test (set as the API's active session)."""

    __test__ = False  # not a test class, whatever pytest's collection rules say

    def __init__(self, spec: dict[str, Any], baseline: Baseline, update: bool) -> None:
        self.spec = spec
        self.baseline = baseline
        self.update = update
        self.calls = 0
        #: Why the op-by-op recording failed (its verdicts are then incomplete), or None.
        self.failure: str | None = None
        self._call_variant: set[Key] = set()
        # key -> (verdict, sizes without difference, sizes differing)
        self._verdicts: dict[Key, tuple[str, set[int], set[int]]] = {}

    def defaults(self, **given: Any) -> dict[str, Any]:
        """The call's arguments, with the marker's where the call left the default."""
        defaults = {"sizes": None, "rtol": None, "atol": None, "tolerance": None, "permute": True}
        out = dict(given)
        explicit_tol = any(given[k] is not None for k in ("rtol", "atol", "tolerance"))
        for name, default in defaults.items():
            if given[name] == default and self.spec[name] != default:
                if name in ("rtol", "atol", "tolerance") and explicit_tol:
                    continue
                out[name] = self.spec[name]
        return out

    def record(
        self,
        plan: Plan,
        cases: Sequence[Case],
        grads: Any,
        result: BatchInvariance,
        start: Any,
    ) -> dict[tuple[str, str], Finding]:
        """Record every sub-batch op by op; keep the verdicts; the findings per case.

        A case's findings are keyed ``(case label, part)``: one per differing part,
        and ``(case label, "*")`` over the whole run.

        The full batch is recorded once and kept; each sub-batch's recording
        is compared with it and dropped, so the memory held is one full run's
        copies and one sub-batch's (each capped by the recorder's limit).
        """
        from pytest_backends.batch.locate import compare_ops, record

        self.calls += 1
        self._call_variant = set()
        findings: dict[tuple[str, str], Finding] = {}
        try:
            start.restore()
            full = record(plan, None, grads)
            if full.dropped_after is not None:
                self.failure = (
                    f"the op recording reached its memory limit ({full.dropped_after / 2**20:.0f}"
                    " MiB of copies); the ops after it have no verdict"
                )
            for case in cases:
                if case.size == plan.n:
                    continue
                start.restore()
                sub = record(plan, case.rows, grads)
                # One finding per differing part (the causes whose data reaches it), and
                # one over the whole run ("*": every cause, for the census and the message).
                parts = [c.part for c in result.cases if c.case == case.label and not c.identical]
                verdicts, findings[(case.label, "*")] = compare_ops(
                    full, sub, plan.n, case.rows, case.label
                )
                # A path torch chose for this size is batch-variant where the rows differ.
                for cause in findings[(case.label, "*")].causes if parts else ():
                    if cause.kind == "path" and (key := cause.key()) is not None:
                        verdicts[key] = "batch_variant"
                for part in dict.fromkeys(parts):
                    _, findings[(case.label, part)] = compare_ops(
                        full, sub, plan.n, case.rows, case.label, part
                    )
                del sub
                for key, verdict in verdicts.items():
                    self._add(key, verdict, case.size)
                    if verdict == "batch_variant":
                        self._call_variant.add(key)
        except Exception as exc:  # the census's own failure is never the test's
            text = str(exc).strip().splitlines()
            self.failure = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
        return findings

    def unaccepted(self) -> set[Key]:
        """The batch-variant ops of the last check that the baseline does not accept."""
        if self.update:
            return set()
        return {key for key in self._call_variant if not self.baseline.accepts(key)}

    def _add(self, key: Key, verdict: str, size: int) -> None:
        from pytest_backends.batch.census import VERDICTS

        old, same, differ = self._verdicts.get(key, ("inconclusive", set(), set()))
        if verdict == "no_difference":
            same.add(size)
        elif verdict == "batch_variant":
            differ.add(size)
        if VERDICTS.index(verdict) < VERDICTS.index(old):
            old = verdict
        self._verdicts[key] = (old, same, differ)

    def accepts(self, finding: Finding | None) -> bool:
        """Whether ``finding`` is a batch-variant op or torch-chosen path the baseline accepts."""
        key = finding.key() if finding is not None else None
        return key is not None and (self.update or self.baseline.accepts(key))

    def rows(self) -> list[dict[str, Any]]:
        """The test's census rows."""
        rows = []
        for (op, device, dtype), (verdict, same, differ) in sorted(
            self._verdicts.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2] or "")
        ):
            sizes = differ if verdict == "batch_variant" else same
            row: dict[str, Any] = {
                "op": op,
                "device": device,
                "dtype": dtype,
                "verdict": verdict,
                "sizes": sorted(sizes),
            }
            if verdict == "batch_variant" and same - differ:
                row["sizes_same"] = sorted(same - differ)  # compared there, no difference
            rows.append(row)
        return rows


def _config_id(item: pytest.Item) -> str:
    config = item.stash.get(_shared.CONFIG_KEY, None)
    return str(getattr(config, "id", None) or "default")


class BatchPlugin:
    """Runs marked tests with the census recorder and gates the run on the baseline."""

    def __init__(self, config: pytest.Config, settings: Settings, baseline: Baseline) -> None:
        self.config = config
        self.settings = settings
        self.baseline = baseline
        self.census = BatchCensus()
        self._errors: list[str] = []
        self._marked = 0
        self._unrecorded: dict[str, str] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        marks = list(item.iter_markers(MARKER))
        if not marks:
            return
        try:
            spec = bind(marks[0].args, dict(marks[0].kwargs))
        except MarkerError as exc:
            pytest.fail(f"@pytest.mark.{MARKER} on {item.nodeid}: {exc}", pytrace=False)
        item.stash[_SPEC_KEY] = spec

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, object, object]:
        spec = item.stash.get(_SPEC_KEY, None)
        if spec is None:
            return (yield)
        from pytest_backends.batch.api import ACTIVE_CHECK

        check = TestCheck(spec, self.baseline, self.settings.baseline_update)
        token = ACTIVE_CHECK.set(check)
        try:
            result = yield
        finally:
            ACTIVE_CHECK.reset(token)
            # On the item: pytest copies it onto the call and teardown reports.
            _shared.attach(
                item,
                _shared.PROPERTY_BATCH,
                {"config": _config_id(item), "rows": check.rows(), "failure": check.failure},
            )
        if check.calls == 0:
            pytest.fail(
                f"{item.nodeid} is marked @pytest.mark.{MARKER} but never called "
                "assert_batch_invariant: the marker declares a check, and none ran",
                pytrace=False,
            )
        return result

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if _xdist.is_worker(self.config):
            return
        data = _shared.read(report, _shared.PROPERTY_BATCH, call=True)
        if not isinstance(data, dict):
            return
        self._marked += 1
        if data.get("failure"):
            self._unrecorded[report.nodeid] = str(data["failure"])
        try:
            self.census.add_test(report.nodeid, str(data.get("config")), data.get("rows") or [])
        except CensusFileError as exc:
            self._errors.append(str(exc))

    def _unaccepted(self) -> dict[Key, list[str]]:
        return {k: t for k, t in self.census.variant().items() if not self.baseline.accepts(k)}

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        config = session.config
        if _xdist.is_worker(config):
            return
        # The census file the determinism check wrote this session, if it wrote one.
        census_path = config.stash.get(_shared.CENSUS_WRITTEN_KEY, None)
        if self._marked and census_path is not None and census_path.is_file():
            from pytest_backends.determinism.census import add_section

            try:
                add_section(census_path, SECTION, self.census.to_data())
            except CensusFileError as exc:
                self._errors.append(f"--backends-census: {exc}")
        settings = self.settings
        if settings.baseline is not None:
            if settings.baseline_update:
                try:
                    updated_baseline(self.baseline, self.census).write(
                        settings.baseline, Versions.current()
                    )
                except CensusFileError as exc:
                    self._errors.append(f"--backends-batch-baseline-update: {exc}")
            elif unaccepted := self._unaccepted():
                ops = ", ".join(_format_key(k) for k in unaccepted)
                _shared.fail_session(
                    session.config,
                    "batch-variant ops not in the baseline",
                    f"{len(unaccepted)} op(s) not in {settings.baseline}: {ops}",
                )
                if session.exitstatus == pytest.ExitCode.OK:
                    session.exitstatus = pytest.ExitCode.TESTS_FAILED
        for error in self._errors:
            _shared.fail_session(session.config, "pytest-backends batch invariance", error)
        if self._errors and session.exitstatus in (
            pytest.ExitCode.OK,
            pytest.ExitCode.NO_TESTS_COLLECTED,
        ):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        if _xdist.is_worker(config) or not (self._marked or self._errors):
            return
        write = terminalreporter.write_line
        terminalreporter.section("batch invariance", sep="=")
        for error in self._errors:
            write(f"ERROR: {error}", red=True)
        for nodeid, reason in sorted(self._unrecorded.items()):
            write(
                f"census incomplete: {nodeid}: the op-by-op recording failed: {reason}", yellow=True
            )
        variant = self.census.variant()
        write(
            f"{len(self.census)} op keys (op, device, dtype) checked in {self._marked} test(s); "
            f"{len(variant)} batch-variant"
        )
        settings = self.settings
        for key, tests in variant.items():
            if settings.baseline is None:
                status = "BATCH-VARIANT"
            elif self.baseline.accepts(key):
                status = "accepted by the baseline"
            elif settings.baseline_update:
                status = "added to the baseline"
            else:
                status = "NEW, not in the baseline"
            per_config = ", ".join(f"{c}: {v}" for c, v in self.census.configs(key).items())
            shown = ", ".join(tests[:3]) + (f" (+{len(tests) - 3} more)" if len(tests) > 3 else "")
            write(
                f"{_format_key(key)}: {status}; {self.census.describe(key)}; "
                f"per config: {per_config}; in {shown}"
            )
        if settings.baseline is not None and not settings.baseline_update:
            unaccepted = self._unaccepted()
            if unaccepted:
                ops = ", ".join(_format_key(k) for k in unaccepted)
                write(
                    f"FAILED: {len(unaccepted)} batch-variant op(s) not in the baseline "
                    f"{settings.baseline}: {ops}",
                    red=True,
                )
            else:
                write(f"every batch-variant op is in the baseline {settings.baseline}")
        elif settings.baseline_update:
            write(f"batch baseline updated: {settings.baseline}")


def _format_key(key: Key) -> str:
    op, device, dtype = key
    where = ", ".join(x for x in (device, dtype) if x)
    return f"{op} ({where})" if where else op
