"""A leak in an xfail-marked test's teardown, reported as the error it is."""

from __future__ import annotations

from collections.abc import Generator

import pytest

__all__ = ["XfailUnmask", "unmask_xfail"]


class XfailUnmask:
    """Reports a leak in an xfail-marked test's teardown as the error it is.

    pytest turns any exception of an xfail-marked test, teardown included,
    into "xfailed"; a leak is not the failure the marker expects. Registered
    on the first such leak (an idle session never pays for the hook); its
    report wrapper runs after pytest's own and makes the report a failure.
    """

    def __init__(self) -> None:
        self.nodeids: set[str] = set()

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when == "teardown" and item.nodeid in self.nodeids:
            self.nodeids.discard(item.nodeid)
            if hasattr(report, "wasxfail"):
                report.outcome = "failed"
                del report.wasxfail
        return report


def unmask_xfail(item: pytest.Item) -> None:
    """Have the teardown report of ``item`` (marked xfail) say failed, not xfailed."""
    if item.get_closest_marker("xfail") is None:
        return
    manager = item.config.pluginmanager
    unmask = manager.get_plugin(XfailUnmask.__name__)
    if unmask is None:
        unmask = XfailUnmask()
        manager.register(unmask, XfailUnmask.__name__)
    assert isinstance(unmask, XfailUnmask)
    unmask.nodeids.add(item.nodeid)
