"""The per-pass marker reader gives what ``iter_markers`` gives, and sees markers added later."""

from __future__ import annotations

import pytest

from pytest_backends.matrix.items import MarkReader, read_marks

SUITE = """
    import pytest

    pytestmark = [pytest.mark.backends("mkldnn"), pytest.mark.slow]

    @pytest.mark.backends(deterministic="on")
    class TestA:
        @pytest.mark.backends(sdpa="math")
        @pytest.mark.parametrize(
            "n", [1, pytest.param(2, marks=pytest.mark.backends(tf32="off"))]
        )
        def test_x(self, n):
            pass

        def test_y(self):
            pass

    def test_plain():
        pass
"""


class _Grab:
    def __init__(self) -> None:
        self.items: list[pytest.Item] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.items = list(session.items)


def test_reader_equals_iter_markers_and_sees_later_markers(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=SUITE)
    grab = _Grab()
    pytester.inline_run("--co", "-p", "no:randomly", "-p", "no:cacheprovider", plugins=[grab])
    items = grab.items
    assert len(items) == 4
    read = MarkReader()
    assert [read(item) for item in items] == [read_marks(item) for item in items]
    # The item's own (decorator, then parameter set), its class's, its module's.
    assert read(items[1]) == [
        ((), {"sdpa": "math"}),
        ((), {"tf32": "off"}),
        ((), {"deterministic": "on"}),
        (("mkldnn",), {}),
    ]
    assert read(items[3]) == [(("mkldnn",), {})]
    # A marker a hook adds to a shared parent between passes: the next pass sees it.
    items[0].getparent(pytest.Module).add_marker(pytest.mark.backends(cudnn="off"))  # type: ignore[union-attr]
    again = MarkReader()
    assert [again(item) for item in items] == [read_marks(item) for item in items]
    assert again(items[3]) == [(("mkldnn",), {}), ((), {"cudnn": "off"})]
