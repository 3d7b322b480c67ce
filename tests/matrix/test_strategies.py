"""The hypothesis strategy and use_config, applied per example."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings

from pytest_backends import use_config
from pytest_backends.matrix.availability import probe
from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.configs import BackendConfig, unavailable_reason
from pytest_backends.strategies import backend_configs

REG = builtin_registry()


@settings(max_examples=25, deadline=None)
@given(config=backend_configs(["mkldnn", "cudnn", "deterministic"]))
def test_drawn_configs_are_runnable_and_applied_per_example(config: BackendConfig) -> None:
    assert unavailable_reason(config, REG, probe()) is None
    before = torch.backends.mkldnn.enabled, torch.are_deterministic_algorithms_enabled()
    with use_config(config):
        assert torch.backends.mkldnn.enabled == (config.axes["mkldnn"] == "on")
        assert torch.are_deterministic_algorithms_enabled() == (
            config.axes["deterministic"] == "on"
        )
    assert (torch.backends.mkldnn.enabled, torch.are_deterministic_algorithms_enabled()) == before


def _drawn(strategy: object) -> set[str]:
    seen: set[str] = set()

    @settings(max_examples=40, deadline=None, database=None)
    @given(config=strategy)
    def draw(config: BackendConfig) -> None:
        seen.add(config.id)

    draw()
    return seen


def test_values_can_be_picked_and_unavailable_ones_kept_on_request() -> None:
    assert _drawn(backend_configs({"sdpa": ["math", "flash"]})) == {"sdpa-math", "sdpa-flash"}
    assert _drawn(backend_configs(["cudnn"], available_only=False)) == {"cudnn-on", "cudnn-off"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_no_runnable_config_skips_with_the_reasons() -> None:
    @given(config=backend_configs({"device": "cuda"}))
    def inner(config: BackendConfig) -> None:
        raise AssertionError("never drawn")

    with pytest.raises(pytest.skip.Exception, match="device-cuda needs CUDA"):
        inner()


def test_use_config_skips_a_config_this_machine_cannot_run() -> None:
    config = REG.make({"device": "mps"}, available_flags=probe().flags, cuda_available=False)
    if probe().mps:
        pytest.skip("this machine has MPS")
    with pytest.raises(pytest.skip.Exception, match="device-mps needs MPS"), use_config(config):
        raise AssertionError("not reached")


def test_strategy_rejects_bad_axes() -> None:
    with pytest.raises(ValueError, match="unknown axis 'mkldn'"):
        backend_configs(["mkldn"])
    with pytest.raises(TypeError):
        backend_configs("mkldnn")


DOCS = Path(__file__).resolve().parents[2] / "docs" / "howto" / "matrix.rst"


def _hypothesis_examples() -> list[str]:
    text = DOCS.read_text()
    section = text[text.index("Draw configurations with hypothesis") :]
    section = section[: section.index("\nAdd your own axes")]
    blocks = re.findall(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", section)
    return [textwrap.dedent(block) for block in blocks]


def test_the_docs_hypothesis_examples_pass_in_a_fresh_session(pytester: pytest.Pytester) -> None:
    examples = _hypothesis_examples()
    assert len(examples) == 2
    for i, code in enumerate(examples):
        pytester.makepyfile(**{f"test_doc{i}": code})
        # Hypothesis's wall-clock deadline fails examples on a loaded runner: each
        # example turns it off.
        assert re.search(r"^@settings\(deadline=None\).*\n@given\(", code, re.MULTILINE), code
    # Fresh processes, as in a user's first run (torch's lazy imports happen in them),
    # under -n 2 as the docs' CI recipe runs them.
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=2)
