"""Hypothesis strategies that draw backend configurations.

This module imports hypothesis (and, when a strategy is built, torch); import
it only from tests that use it.  Apply a drawn config per example with
:func:`pytest_backends.use_config`: function-scoped fixtures such as
``backend_config`` are set up once for the whole ``@given`` test, not once per
example::

    from hypothesis import given
    from pytest_backends import use_config
    from pytest_backends.strategies import backend_configs

    @given(config=backend_configs(["mkldnn", "deterministic"]))
    def test_conv(config):
        with use_config(config):
            ...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import strategies as st

from pytest_backends.matrix import availability, markers
from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.configs import AxisRegistry, BackendConfig, unavailable_reason

# The largest product of axes a strategy enumerates: the limit of the matrix itself.
from pytest_backends.matrix.expand import MAX_CONFIGS

__all__ = ["MAX_CONFIGS", "backend_configs", "warm"]


def _skip(reason: str) -> st.SearchStrategy[BackendConfig]:
    def draw(_: object) -> BackendConfig:
        pytest.skip(reason)

    return st.just(None).map(draw)


def backend_configs(
    axes: Sequence[str] | Mapping[str, str | Sequence[str]],
    *,
    available_only: bool = True,
    registry: AxisRegistry | None = None,
) -> st.SearchStrategy[BackendConfig]:
    """A strategy of :class:`~pytest_backends.matrix.configs.BackendConfig` over ``axes``.

    ``axes`` is a list of axis names (every value) or a mapping of axis name to
    value(s), as in ``@pytest.mark.backends``.  With ``available_only`` (the
    default) only configs this machine can run are drawn; if there are none,
    drawing skips the test with the reasons.  Examples shrink towards the first
    config in id order.
    """
    registry = registry or builtin_registry()
    if isinstance(axes, str):
        raise TypeError("axes is a list of axis names or a mapping, not a string")
    if isinstance(axes, Mapping):
        mark: tuple[Sequence[object], Mapping[str, object]] = ((), dict(axes))
    else:
        mark = (tuple(axes), {})
    selection = markers.resolve([mark], registry)
    combos = registry.product(selection)
    if len(combos) > MAX_CONFIGS:
        raise ValueError(
            f"{len(combos)} configurations over {', '.join(selection)}; name fewer axes or "
            f"values (at most {MAX_CONFIGS})"
        )
    avail = availability.probe()
    configs = [
        registry.make(c, available_flags=avail.flags, cuda_available=avail.cuda) for c in combos
    ]
    if not available_only:
        return st.sampled_from(configs)
    reasons = {c: unavailable_reason(c, registry, avail) for c in configs}
    runnable = [c for c in configs if reasons[c] is None]
    if not runnable:
        details = sorted({r for r in reasons.values() if r})
        return _skip("no configuration of these axes can run here: " + "; ".join(details))
    warm(runnable)
    return st.sampled_from(runnable)


def warm(configs: Sequence[BackendConfig]) -> None:
    """Apply each config's flags once, and restore them.

    Torch imports some modules the first time a flag is set (the first
    ``torch.use_deterministic_algorithms(True)`` takes about a second). Done
    while the strategy is built, that cost does not land in the first example,
    where hypothesis's deadline would fail the test as flaky.
    """
    from pytest_backends.flags import override_flags

    for config in configs:
        if config.flags:
            with override_flags(config.flags):
                pass
