"""The matrix's collection hooks: expand marked tests, attach configs to items.

Data flows one way, from markers to configs to items:

1. :meth:`MatrixPlugin.pytest_generate_tests` binds each test's
   ``@pytest.mark.backends`` markers and, with ``--backends-matrix``,
   parametrizes the test over the (optionally sampled) product of its axes
   (:mod:`pytest_backends.matrix.expand`).  ``unittest.TestCase`` classes,
   which pytest never parametrizes, get one test method per config instead
   (:mod:`pytest_backends.matrix.testcase`).
2. :meth:`MatrixPlugin.pytest_collection_modifyitems` runs after every other
   implementation of the hook: items that a conftest or plugin gave a
   ``backends`` marker there are collected again with it (one item per
   config); markers that cannot be honoured are a ``BackendsMarkerWarning``
   naming the test.  It then stores each item's
   :class:`~pytest_backends.matrix.configs.BackendConfig` under
   :data:`pytest_backends._shared.CONFIG_KEY`, hands its flags to the leak
   guard (:data:`pytest_backends._shared.ITEM_FLAGS_KEY`), and turns a config
   this machine cannot run into a skip with a precise reason.

The check for markers added late reads each item's markers once per pass,
and those of the parents items share once per pass
(:class:`pytest_backends.matrix.items.MarkReader`).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_backends import _selected, _shared, _xdist
from pytest_backends.matrix import availability, coverage, markers, testcase
from pytest_backends.matrix.configs import (
    DEFAULT_CONFIG,
    AxisRegistry,
    BackendConfig,
    ConfigError,
    unavailable_reason,
)
from pytest_backends.matrix.expand import expand
from pytest_backends.matrix.items import (
    PARAM,
    Mark,
    MarkReader,
    definition_id,
    read_marks,
    same,
    same_params,
)
from pytest_backends.matrix.registry import axis_registry
from pytest_backends.matrix.settings import MatrixSettings, check_axes, check_config_ids

if TYPE_CHECKING:
    from pytest_backends.matrix.availability import Availability

__all__ = ["INVALID_MARKER_ID", "MARKER_ERROR_KEY", "MarkerErrors", "MatrixPlugin"]

#: The matrix report's row for tests whose marker is invalid (they fail at setup).
INVALID_MARKER_ID = "invalid-marker"
#: Why an item's ``@pytest.mark.backends`` marker is invalid (the item fails at setup).
MARKER_ERROR_KEY: pytest.StashKey[str] = pytest.StashKey()


class MatrixPlugin:
    """Expands marked tests and attaches configs to items."""

    def __init__(self, config: pytest.Config, settings: MatrixSettings) -> None:
        self.config = config
        self.settings = settings
        self._availability: Availability | None = None
        self._configs: dict[tuple[tuple[str, str], ...], BackendConfig] = {}
        self._reasons: dict[BackendConfig, str | None] = {}
        self._selections: dict[str, dict[str, tuple[str, ...]]] = {}
        self._errors: dict[str, str] = {}
        self._select: tuple[frozenset[tuple[str, str]], ...] = ()
        self._select_axes: set[str] = set()
        # Items a --backends-config group selected (the empty-selection check).
        self._matched = 0
        self._header_shown = False
        # Markers of each test when it was expanded (None: it had none then).
        self._seen: dict[str, list[Mark]] = {}
        # Markers of each definition when the matrix expanded it (checked after all hooks).
        self._definition_marks: dict[str, list[Mark]] = {}
        # Markers a re-collection must use (markers added by hooks), by test.
        self._pending: dict[str, list[Mark]] = {}
        # TestCase config items: node id -> (test's node id, config).
        self._named: dict[str, tuple[str, BackendConfig]] = {}
        # TestCase matrix subclass -> the user's class.
        self._bases: dict[type, type] = {}
        # Node ids given with a config id: (file, test without [...]) -> wanted "::" tails.
        self._wanted: dict[tuple[Path, str], set[str]] = {}
        #: Node ids of the items that markers added by hooks expanded.
        self.late: list[str] = []
        #: Every item collected in this process, deselected ones included: node id ->
        #: config id (empty: no config). ``pytest-backends merge`` checks coverage with it.
        self.collected = coverage.collected(config)

    # registry and machine ------------------------------------------------------------------

    def registry(self) -> AxisRegistry:
        """The run's axes (:func:`~pytest_backends.matrix.registry.axis_registry`)."""
        return axis_registry(self.config)

    def availability(self) -> Availability:
        """What this machine can run (imports torch on first use)."""
        if self._availability is None:
            self._availability = availability.probe()
        return self._availability

    def build(self, choices: tuple[tuple[str, str], ...]) -> BackendConfig:
        """The config for ``choices`` (cached; raises ``ConfigError`` on conflicting flags)."""
        config = self._configs.get(choices)
        if config is None:
            avail = self.availability()
            config = self.registry().make(
                choices, available_flags=avail.flags, cuda_available=avail.cuda
            )
            self._configs[choices] = config
        return config

    def reason(self, config: BackendConfig) -> str | None:
        """Why ``config`` cannot run here (cached), or ``None``."""
        if not config.choices:
            return None
        if config not in self._reasons:
            self._reasons[config] = unavailable_reason(config, self.registry(), self.availability())
        return self._reasons[config]

    # hooks ---------------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        registry = self.registry()
        if self.settings.axes:
            check_axes(self.settings.axes, registry, self.settings.axes_source)
        self._select = check_config_ids(self.settings.select, registry, self.settings.select_source)
        self._select_axes = {axis for group in self._select for axis, _ in group}

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        lines: list[str] = []
        if self.settings.enabled or availability.torch_imported():
            lines += availability.header_lines(self.availability())
            self._header_shown = True
        else:
            lines.append(availability.HINT)
        if self.settings.enabled:
            lines.append(self.settings.describe())
        return lines

    def _resolve(self, defid: str, marks: Sequence[Mark]) -> list[BackendConfig]:
        """Resolve one test's markers; its configs (empty: it runs once, unparametrized).

        Records the resolved selection (or the marker's error) under ``defid``.
        """
        self._seen[defid] = list(marks)
        try:
            selection = markers.resolve(marks, self.registry())
        except markers.MarkerError as exc:
            self._errors[defid] = f"invalid @pytest.mark.backends on {defid}: {exc}"
            return []
        self._selections[defid] = selection
        if not self.settings.enabled:
            return []
        try:
            combos = expand(selection, self.registry(), self.settings, defid)
            return [self.build(c) for c in combos]
        except ConfigError as exc:
            self._errors[defid] = f"invalid backend configuration for {defid}: {exc}"
            self._selections.pop(defid)
            return []

    @pytest.hookimpl(wrapper=True)
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> Generator[None, None, None]:
        """Warn when a later ``pytest_generate_tests`` adds markers the matrix missed."""
        defid = metafunc.definition.nodeid
        yield
        before = self._definition_marks.pop(defid, [])
        if read_marks(metafunc.definition) != before:
            metafunc.definition.warn(
                markers.BackendsMarkerWarning(
                    f"@pytest.mark.backends on {defid} is not expanded: a pytest_generate_tests "
                    "hook added it after the matrix had expanded the test. Give that hook "
                    "@pytest.hookimpl(tryfirst=True), or add the marker in "
                    "pytest_collection_modifyitems"
                )
            )

    @pytest.hookimpl(specname="pytest_generate_tests")
    def pytest_generate_tests_matrix(self, metafunc: pytest.Metafunc) -> None:
        defid = metafunc.definition.nodeid
        self._definition_marks[defid] = read_marks(metafunc.definition)
        marks = self._pending.pop(defid, None) or self._definition_marks[defid]
        if not marks:
            return
        configs = self._resolve(defid, marks)
        if not configs:
            return
        if PARAM not in metafunc.fixturenames:
            metafunc.fixturenames.append(PARAM)
        metafunc.parametrize(PARAM, configs, ids=[c.id for c in configs])

    @pytest.hookimpl(wrapper=True)
    def pytest_pycollect_makeitem(
        self, collector: pytest.Collector, name: str, obj: object
    ) -> Generator[None, Any, Any]:
        result = yield
        if isinstance(result, pytest.Class) and testcase.is_testcase(obj) and result.obj is obj:
            self._expand_testcase(result)
        return result

    def _expand_testcase(self, node: pytest.Class) -> None:
        """Give each marked method of a ``TestCase`` class one test per config."""
        cls = node.obj
        expanded: dict[str, list[str]] = {}
        for name in testcase.unittest_names(cls):
            defid = f"{node.nodeid}::{name}"
            marks = self._pending.pop(defid, None) or testcase.method_marks(cls, name, node)
            if not marks:
                continue
            configs = self._resolve(defid, marks)
            if not configs:
                continue
            if not testcase.expandable(cls, name):
                self._errors[defid] = (
                    f"{defid}: @pytest.mark.backends needs a plain test method on a "
                    "unittest.TestCase (this one is a staticmethod, classmethod or other "
                    "descriptor); make it a method, or move the test to a function"
                )
                continue
            names = testcase.config_names(name, [c.id for c in configs])
            expanded[name] = names
            for config_name, backend in zip(names, configs):
                self._named[f"{node.nodeid}::{config_name}"] = (defid, backend)
        if expanded:
            node.obj = testcase.matrix_subclass(cls, expanded)
            self._bases[node.obj] = cls

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> Generator[None, None, None]:
        # After every other implementation: markers that conftests and plugins add
        # in their own pytest_collection_modifyitems are expanded here.
        yield
        items[:] = self._expand_late(items)
        self._narrow_to_node_ids(items)
        self._check_misspelt(items)
        self._attach(config, items)

    def _check_misspelt(self, items: list[pytest.Item]) -> None:
        """A marker whose name is close to ``backends`` but not registered: did you mean it?"""
        registered = {
            line.split(":")[0].split("(")[0].strip() for line in self.config.getini("markers")
        }
        warned: set[str] = set()
        for item in items:
            if warned and self._defid(item) in warned:
                continue
            for mark in item.iter_markers():
                if mark.name == markers.MARKER or mark.name in registered:
                    continue
                if difflib.get_close_matches(mark.name, [markers.MARKER], n=1, cutoff=0.75):
                    defid = self._defid(item)
                    warned.add(defid)
                    message = (
                        f"@pytest.mark.{mark.name} on {defid} is not a pytest-backends marker: "
                        f"did you mean @pytest.mark.{markers.MARKER}?"
                    )
                    if _shared.strict(self.config):
                        self._errors.setdefault(defid, message + " (--backends-strict)")
                    else:
                        item.warn(markers.BackendsMarkerWarning(message))
                    break

    # markers added by hooks ------------------------------------------------------------------

    def _defid(self, item: pytest.Item) -> str:
        named = self._named.get(item.nodeid)
        return named[0] if named is not None else definition_id(item)

    def _expand_late(self, items: list[pytest.Item]) -> list[pytest.Item]:
        """The items, with those whose ``backends`` markers a hook added expanded now."""
        late: dict[str, tuple[str, list[Mark]]] = {}
        groups: dict[tuple[str, str], dict[str, list[Mark]]] = {}
        expanded = dict(self._seen)  # as they were before this hook resolves late markers
        read = MarkReader()
        for item in items:
            marks = read(item)
            if not marks:  # most items: no definition id needed
                continue
            defid = self._defid(item)
            seen = expanded.get(defid)
            if marks == seen or defid in self._errors:
                continue
            if seen:
                if all(any(same(m, s) for s in seen) for m in marks):
                    # Fewer markers than at expansion (a plugin added one to the
                    # definition only): nothing was added after the matrix ran.
                    continue
                self._late_warning(item, markers.added_after_expansion(item))
                continue
            if not isinstance(item, pytest.Function) or not isinstance(
                item.parent, (pytest.Module, pytest.Class)
            ):
                self._late_warning(
                    item,
                    (
                        "only Python test functions and unittest.TestCase methods can be "
                        "expanded; mark a Python test instead"
                    ),
                )
                continue
            if not self._resolve(defid, marks):
                continue  # invalid, matrix off, or no axis left: runs once, as marked
            key = self._group(item, defid, marks)
            groups.setdefault(key, {})[defid] = marks
            late[item.nodeid] = (defid, marks)
        if not late:
            return items
        made: dict[tuple[str, str], list[pytest.Item]] = {}
        for key, pending in groups.items():
            self._pending.update(pending)
            try:
                made[key] = self._collect_again(
                    next(i for i in items if i.nodeid in late and late[i.nodeid][0] in pending)
                )
            finally:
                for defid in pending:
                    self._pending.pop(defid, None)
        out: list[pytest.Item] = []
        for item in items:
            if item.nodeid not in late:
                out.append(item)
                continue
            defid, marks = late[item.nodeid]
            key = self._group(item, defid, marks)
            fresh = [
                new for new in made[key] if self._defid(new) == defid and same_params(item, new)
            ]
            if not fresh:
                self._late_warning(item, "collecting the test again gave no item for it")
                out.append(item)
                continue
            added = [m for m in item.own_markers if m not in fresh[0].own_markers]
            for new in fresh:
                # As Node.add_marker does, without re-checking the mark's registration.
                new.own_markers.extend(added)
                new.keywords.update((mark.name, mark) for mark in added)
                _shared.copy_properties(item, new)
            self.late.append(item.nodeid)
            out.extend(fresh)
            if len(fresh) > 1:
                # The collected count ("collected N items") counts the items that run.
                self.config.hook.pytest_collectreport(
                    report=pytest.CollectReport(item.nodeid, "passed", None, [*fresh[1:]])
                )
        return out

    def expand_hook_markers(self, items: list[pytest.Item]) -> None:
        """Expand the markers that hooks run before this one added.

        Called from the registrar's ``pytest_collection_modifyitems``, which runs
        after conftest implementations and before pytest's own ``-k``, ``-m`` and
        ``--deselect``, so these select among the expanded items. Markers added
        later still expand in the wrapper at the end of the hook.
        """
        items[:] = self._expand_late(items)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        """Let a node id name a config that a hook adds (``test_x[mkldnn-off]``).

        Such an item does not exist while pytest collects; the argument is
        collected without its ``[...]`` and narrowed to the named item once the
        matrix has expanded the test.
        """
        args = session.config.args
        if not any("[" in arg for arg in args):
            return
        from pytest_backends.matrix.report import config_in_nodeid

        plain = set(args)
        named = [a for a in args if "[" in a and config_in_nodeid(a, self.registry().parse_id)]
        if named and not self.settings.enabled and not _xdist.is_worker(session.config):
            from pytest_backends.matrix.named_ids import off_message

            raise pytest.UsageError(off_message(named))
        for i, arg in enumerate(args):
            head, sep, tail = arg.partition("::")
            start = tail.find("[", tail.rfind("::") + 1) if sep else -1
            if start < 0 or not tail.endswith("]"):
                continue
            if config_in_nodeid(arg, self.registry().parse_id) is None:
                continue
            base = f"{head}::{tail[:start]}"
            if base in plain:
                continue  # the whole test is asked for too
            args[i] = base
            path = (session.config.invocation_params.dir / head).resolve()
            self._wanted.setdefault((path, tail[:start]), set()).add(tail)

    def _narrow_to_node_ids(self, items: list[pytest.Item]) -> None:
        """Keep, of the tests named with a config id, only the items named (see named_ids)."""
        if not self._wanted:
            return
        from pytest_backends.matrix import named_ids

        kept, dropped, missing = named_ids.narrow(items, self._wanted)
        if missing and not _xdist.is_worker(self.config):  # a worker's error would crash it
            raise pytest.UsageError(named_ids.missing_message(self._wanted, missing))
        if dropped:
            self.config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    def _group(self, item: pytest.Item, defid: str, marks: list[Mark]) -> tuple[str, str]:
        """What one re-collection covers: a function's items, or a whole TestCase class."""
        if item.nodeid in self._named or testcase.is_testcase(getattr(item, "cls", None)):
            return ("class", str(getattr(item.parent, "nodeid", "")))
        return (defid, repr(marks))

    def _late_warning(self, item: pytest.Item, why: str) -> None:
        message = f"@pytest.mark.backends on {item.nodeid} is not expanded: {why}"
        if _shared.strict(self.config):
            self._errors[self._defid(item)] = message + " (--backends-strict)"
        else:
            item.warn(markers.BackendsMarkerWarning(message))

    def _collect_again(self, item: pytest.Item) -> list[pytest.Item]:
        """The items pytest makes for ``item``'s test (or class) now that markers are pending.

        Goes through the public ``pytest_pycollect_makeitem`` hook, so parametrization,
        ids and fixtures are pytest's own, and :meth:`pytest_generate_tests` (or, for a
        ``TestCase``, :meth:`_expand_testcase`) sees the pending markers.
        """
        assert isinstance(item, pytest.Function)
        parent = item.parent
        assert isinstance(parent, (pytest.Module, pytest.Class))
        if item.nodeid in self._named or testcase.is_testcase(item.cls):
            above = parent.parent
            assert isinstance(above, (pytest.Module, pytest.Class))
            cls = self._bases.get(parent.obj, parent.obj)
            made = above.ihook.pytest_pycollect_makeitem(collector=above, name=parent.name, obj=cls)
            if not isinstance(made, pytest.Class):
                return []
            return [new for new in made.collect() if isinstance(new, pytest.Item)]
        raw = inspect.getattr_static(parent.obj, item.originalname)
        made = parent.ihook.pytest_pycollect_makeitem(
            collector=parent, name=item.originalname, obj=raw
        )
        made = made if isinstance(made, list) else [made] if made is not None else []
        return [new for new in made if isinstance(new, pytest.Item)]

    # configs on items ------------------------------------------------------------------------

    def _attach(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        """Store each item's config, hand its flags to the leak guard, skip what cannot run."""
        if not self._selections and not self._errors and not self._select:
            return
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            named = self._named.get(item.nodeid)
            defid = named[0] if named is not None else definition_id(item)
            error = self._errors.get(defid)
            if error is not None:
                item.stash[MARKER_ERROR_KEY] = error
                # In the matrix report too, so a failed run never reads as all green there.
                _shared.attach(item, _shared.PROPERTY_CONFIG, INVALID_MARKER_ID)
                kept.append(item)
                continue
            if defid not in self._selections:
                kept.append(item)  # --backends-config narrows marked tests only
                continue
            if named is not None:
                testcase.align_node_id(item)
                backend = named[1]
            else:
                callspec = getattr(item, "callspec", None)
                params = callspec.params if callspec is not None else {}
                backend = params.get(PARAM, DEFAULT_CONFIG)
            if not isinstance(backend, BackendConfig):
                backend = DEFAULT_CONFIG
            if self._select and (backend.choices or item.get_closest_marker("backends")):
                # An item of a marked test without a marker of its own (a pytest.param
                # beside a marked one) is unmarked: it runs as without the option.
                marked = {*self._selections[defid], *backend.axes}
                if marked & self._select_axes:
                    if not any(g <= set(backend.choices) for g in self._select):
                        dropped.append(item)
                        continue
                    self._matched += 1
            kept.append(item)
            item.stash[_shared.CONFIG_KEY] = backend
            _shared.attach(item, _shared.PROPERTY_CONFIG, backend.id)
            why = self.reason(backend)
            if why is not None:
                item.add_marker(pytest.mark.skip(reason=why))
            elif backend.flags:
                item.stash[_shared.ITEM_FLAGS_KEY] = backend.flags
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    def _config_id(self, item: pytest.Item) -> str:
        backend: object = _shared.stashed(item.stash, _shared.CONFIG_KEY, None)
        if backend is None:
            named = self._named.get(item.nodeid)
            callspec = getattr(item, "callspec", None)
            params = callspec.params if callspec is not None else {}
            backend = named[1] if named is not None else params.get(PARAM)
        return backend.id if isinstance(backend, BackendConfig) and backend.choices else ""

    def pytest_deselected(self, items: Sequence[pytest.Item]) -> None:
        for item in items:
            self.collected[item.nodeid] = self._config_id(item)
        coverage.deselected(self.config).update(item.nodeid for item in items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        for item in session.items:
            self.collected[item.nodeid] = self._config_id(item)
        self._record_selection(session)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        if session.config.option.verbose < 0:
            # Quiet runs (``--co -q``) still say which markers are wrong.
            for message in self._errors.values():
                reporter.write_line(f"ERROR {message}", red=True)
            return
        if self._selections and not self._header_shown and not session.config.option.no_header:
            for line in availability.header_lines(self.availability()):
                reporter.write_line(line)
            self._header_shown = True
        for message in self._errors.values():
            reporter.write_line(f"ERROR {message}", red=True)
        if self.late:
            reporter.write_line(
                f"backends: {len(self.late)} test(s) marked by hooks expanded into their "
                "configs after collection"
            )

    def _record_selection(self, session: pytest.Session) -> None:
        """How many items the matrix and the verifier act on (for the empty-selection check)."""
        if not self.settings.enabled and self.settings.verify == "off":
            return  # neither acts on any item: nothing to count
        configs = [
            c
            for item in session.items
            if isinstance(
                c := _shared.stashed(item.stash, _shared.CONFIG_KEY, DEFAULT_CONFIG), BackendConfig
            )
            and c.choices
        ]
        if self.settings.enabled and self.settings.select:
            _selected.record(
                self.config,
                self.settings.select_source,
                self._matched,
                self.settings.select_hint(
                    {axis for sel in self._selections.values() for axis in sel},
                    self._select_axes,
                ),
            )
        elif self.settings.enabled:
            axes = f"axes {', '.join(self.settings.axes)}" if self.settings.axes else "any axis"
            _selected.record(
                self.config,
                self.settings.axes_source,
                len(configs),
                f"no collected test is marked @pytest.mark.backends with {axes}",
            )
        self._record_verify(configs)

    def _record_verify(self, configs: list[BackendConfig]) -> None:
        if self.settings.verify != "off":
            from pytest_backends.matrix.verify import promises_for

            checked = sum(1 for c in configs if promises_for(c))
            _selected.record(
                self.config,
                "--backends-verify",
                checked,
                (
                    "no item runs a configuration whose kernel path can be checked; verification "
                    "needs --backends-matrix and tests marked with the mkldnn, nnpack, cudnn or "
                    "sdpa axis"
                ),
            )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        coverage.send_to_controller(self.config, self.collected)
        # ``--collect-only`` runs no setup, where invalid markers fail their tests: the
        # session fails as for a collection error instead.
        if (
            self._errors
            and session.config.option.collectonly
            and session.exitstatus == pytest.ExitCode.OK
        ):
            session.exitstatus = pytest.ExitCode.INTERRUPTED


class MarkerErrors:
    """Fails, at setup, each test whose ``backends`` marker was wrong.

    Asked for at the end of collection (:func:`pytest_backends.matrix.feature.collected`)
    only when such a test was collected, so a session without one runs no
    per-test hook of the matrix.
    """

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Fail ``item`` with its marker error, if it has one."""
        error = item.stash.get(MARKER_ERROR_KEY, None)
        if error is not None:
            pytest.fail(error, pytrace=False)
