"""One declarative table of the plugin's options, and the one resolver.

Every option has a command-line flag and an ini key of the same name
(``--backends-matrix`` / ``backends_matrix``); :data:`OPTIONS` holds each
one's flag, ini key, kind, default and help.  :func:`register` adds them all;
:func:`lookup` resolves one value with a single precedence rule:
**command line > ini file > default**.  Parsing a value into a setting is the
feature's job (pure functions that raise :class:`pytest.UsageError`).

Options that can be turned off share one vocabulary: :data:`OFF_WORDS`
(``off``, ``none``, ``no``, ``false``, ``0``) and :data:`ON_WORDS`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pytest

__all__ = [
    "OFF_WORDS",
    "ON_WORDS",
    "OPTIONS",
    "Option",
    "Raw",
    "is_off",
    "is_on",
    "lookup",
    "register",
]

#: Words that turn an option off, wherever an option can be off.
OFF_WORDS = ("off", "none", "no", "false", "0")
#: Words that turn an option on (with its default value).
ON_WORDS = ("on", "yes", "true", "1")

Kind = Literal["value", "optional", "list", "flag"]


def is_off(text: str) -> bool:
    """Whether ``text`` is one of :data:`OFF_WORDS` (case and spaces ignored)."""
    return text.strip().lower() in OFF_WORDS


def is_on(text: str) -> bool:
    """Whether ``text`` is one of :data:`ON_WORDS` (case and spaces ignored)."""
    return text.strip().lower() in ON_WORDS


@dataclass(frozen=True)
class Option:
    """One option: ``--<flag>`` on the command line and ``<ini>`` in the ini file.

    ``kind``: ``value`` (takes a value), ``optional`` (a bare flag means
    ``const``), ``list`` (repeatable; ini: whitespace-separated) or ``flag``
    (on/off; ini: one of :data:`ON_WORDS` or :data:`OFF_WORDS`).  ``default``
    is the value when neither the command line nor the ini file sets it.
    """

    name: str
    kind: Kind
    metavar: str
    help: str
    ini_help: str
    default: str = ""
    const: str | None = None

    @property
    def flag(self) -> str:
        """The command-line flag: ``--backends-matrix``."""
        return "--" + self.name.replace("_", "-")

    @property
    def ini(self) -> str:
        """The ini key: ``backends_matrix``."""
        return self.name


OPTIONS: tuple[Option, ...] = (
    Option(
        "backends_leaks",
        "value",
        "MODE",
        "what to do when a test leaves a torch backend flag changed: fail (default), warn or off",
        "what to do when a test leaks a torch backend flag: fail, warn or off",
        default="fail",
    ),
    Option(
        "backends_matrix",
        "optional",
        "AXES",
        "run each @pytest.mark.backends test once per backend configuration. "
        "Optionally restrict the axes: --backends-matrix=mkldnn,device ('off' disables)",
        "backend matrix: off, all, or a comma-separated list of axes",
        default="off",
        const="all",
    ),
    Option(
        "backends_sample",
        "value",
        "N",
        "run a seeded sample of N configurations per test instead of the full product",
        "configurations sampled per test (empty: all)",
    ),
    Option(
        "backends_seed",
        "value",
        "S",
        "seed of --backends-sample (default: random, shown in the header)",
        "seed of backends_sample (empty: random)",
    ),
    Option(
        "backends_config",
        "list",
        "ID",
        "run only the items of the configurations matching ID (e.g. mkldnn-off or "
        "cudnn-on,sdpa-math; every token must match); repeatable; implies --backends-matrix",
        "run only the items of these configuration ids",
    ),
    Option(
        "backends_verify",
        "optional",
        "MODE",
        "check with torch.profiler that each config's kernel path really ran: "
        "on (broken promises fail, unexercised ones are reported), strict (unexercised "
        "ones fail too) or off",
        "kernel-path verification: off, on or strict",
        default="off",
        const="on",
    ),
    Option(
        "backends_report",
        "value",
        "PATH",
        "write the matrix report as JSON to PATH",
        "path of the JSON matrix report",
    ),
    Option(
        "backends_html",
        "value",
        "PATH",
        "write the matrix report as a self-contained HTML grid to PATH",
        "path of the HTML matrix report",
    ),
    Option(
        "backends_cpu_capability",
        "value",
        "LEVELS",
        "run every test once per CPU capability level, each level in pytest-xdist workers "
        "started with ATEN_CPU_CAPABILITY=<level>: a comma-separated list of default, avx2, "
        "avx512, vsx, zvector, sve256, 'all' (every level this CPU can run) or 'off'. "
        "-n N starts N workers per level. A test whose @pytest.mark.backends names "
        "cpu_capability keeps its levels",
        "CPU capability levels to run every test under (comma-separated, 'all' or 'off')",
    ),
    Option(
        "backends_determinism",
        "optional",
        "N",
        "run each test marked @pytest.mark.backends(deterministic=...) N times "
        "(bare flag: 5) under an op recorder and fail it when an op's output differs "
        "between runs; 'off' disables",
        "determinism runs per selected test: a number >= 2, 'on' (5) or 'off'",
        const="on",
    ),
    Option(
        "backends_determinism_all",
        "flag",
        "",
        "check every test, not only marked ones (turns the check on)",
        "determinism check for every test",
    ),
    Option(
        "backends_census",
        "value",
        "PATH",
        "write the op census (verdict per op, device and dtype) as JSON to PATH "
        "(turns the check on)",
        "op census JSON file to write",
    ),
    Option(
        "backends_baseline",
        "value",
        "PATH",
        "JSON file of accepted nondeterministic ops: the run fails only for ops "
        "not in it (turns the check on)",
        "baseline JSON file of accepted ops",
    ),
    Option(
        "backends_baseline_update",
        "flag",
        "",
        "rewrite the --backends-baseline file with this run's nondeterministic ops "
        "instead of failing on them",
        "rewrite the baseline file",
    ),
    Option(
        "backends_determinism_repeatable",
        "flag",
        "",
        "fail tests whose reruns differ from run 0 because of state outside torch ops "
        "(or raise where run 0 passed), instead of reporting them as not checked",
        "fail tests that are not repeatable under the determinism check",
    ),
    Option(
        "backends_batch_baseline",
        "value",
        "PATH",
        "baseline JSON file of accepted batch-variant ops: tests marked "
        "@pytest.mark.batch_invariant pass when their first batch-variant op is in it, and "
        "the run fails only for batch-variant ops not in it",
        "baseline JSON file of accepted batch-variant ops",
    ),
    Option(
        "backends_batch_baseline_update",
        "flag",
        "",
        "rewrite the --backends-batch-baseline file with this run's batch-variant ops "
        "instead of failing on them",
        "rewrite the batch-invariance baseline file",
    ),
    Option(
        "backends_diverge",
        "flag",
        "",
        "for a @pytest.mark.backends test that fails under one configuration and passes "
        "under another, rerun both recorded and name the first op where their kernel "
        "paths part (appended to the failure and to the report's cell)",
        "name the op where a failing configuration parts from a passing one",
    ),
    Option(
        "backends_trace",
        "value",
        "DIR",
        "save per-op numeric sketches (digest, shape, dtype, a fixed sample of values, "
        "norms) of each @pytest.mark.backends test and configuration under DIR, for "
        "`pytest-backends diverge`",
        "directory for per-op trace sketches",
    ),
    Option(
        "backends_label",
        "value",
        "NAME",
        "name of this job or machine in the matrix report and the census "
        "(default: host name/CPU capability/GPU)",
        "name of this job or machine in the report and census",
    ),
    Option(
        "backends_strict",
        "flag",
        "",
        "fail the run (exit code 4) when a --backends-* option selected no test, "
        "and fail tests whose @pytest.mark.backends the matrix could not honour",
        "fail runs where a backends option selected nothing",
    ),
)


@functools.lru_cache(maxsize=4)
def _index(options: tuple[Option, ...]) -> dict[str, Option]:
    return {option.name: option for option in options}


def register(parser: pytest.Parser) -> None:
    """Add every option of :data:`OPTIONS` and its ini twin."""
    group = parser.getgroup("backends", "torch backend flags, matrix and determinism")
    for option in OPTIONS:
        help_text = f"{option.help}. ini: {option.ini}"
        if option.kind == "flag":
            group.addoption(option.flag, action="store_true", default=None, help=help_text)
            # Read as text and parsed with the plugin's one on/off vocabulary, not pytest's
            # bool (which knows no "none" and names no key when it refuses a value).
            parser.addini(option.ini, option.ini_help, default="")
            continue
        kwargs: dict[str, Any] = {"default": None, "metavar": option.metavar, "help": help_text}
        if option.kind == "optional":
            kwargs.update(nargs="?", const=option.const)
        group.addoption(
            option.flag, action="append" if option.kind == "list" else "store", **kwargs
        )
        if option.kind == "list":
            parser.addini(option.ini, option.ini_help, type="args", default=[])
        else:
            # The table's default applies in lookup(), so an unset key reads as unset.
            parser.addini(option.ini, option.ini_help, default="")


@dataclass(frozen=True)
class Raw:
    """An option's unparsed value and where it came from (for error messages)."""

    value: Any
    source: str
    from_cli: bool

    @property
    def text(self) -> str:
        """The value as text (``""`` for an unset value)."""
        if isinstance(self.value, (list, tuple)):
            return ",".join(str(v) for v in self.value)
        return "" if self.value is None else str(self.value)


def _switch(ini: object, option: Option) -> bool:
    """An on/off ini value: :data:`ON_WORDS`, :data:`OFF_WORDS` or empty (off)."""
    if isinstance(ini, bool):
        return ini
    text = "" if ini is None else str(ini)
    word = text.strip().lower()
    # pytest's own spellings of a bool ini value ("y", "f", ...) keep working.
    if word == "" or is_off(word) or word in ("n", "f"):
        return False
    if is_on(word) or word in ("y", "t"):
        return True
    raise pytest.UsageError(
        f"ini option {option.ini}: expected on or off ({', '.join(ON_WORDS)} / "
        f"{', '.join(OFF_WORDS)}), got {text.strip()!r}"
    )


def lookup(config: pytest.Config, name: str) -> Raw:
    """The value of option ``name``: command line > ini file > default."""
    option = _index(OPTIONS)[name]
    cli = config.getoption(option.name, None)
    if cli is not None and (option.kind != "flag" or cli):
        given = cli if isinstance(cli, (list, tuple)) else [cli]
        if any(isinstance(v, str) and not v.strip() for v in given):
            # Most often a shell variable that was not set: it must not turn a feature off.
            raise pytest.UsageError(
                f"{option.flag}= was given an empty value (an unset shell variable?); "
                f"give a value, or leave the option out"
            )
        return Raw(cli, option.flag, True)
    try:
        ini = config.getini(option.ini)
    except ValueError:  # not registered (the plugin was loaded late)
        ini = None
    if option.kind == "list":
        values: Sequence[str] = list(ini or ())
        return Raw(values, f"ini option {option.ini}", False)
    if option.kind == "flag":
        return Raw(_switch(ini, option), f"ini option {option.ini}", False)
    text = "" if ini is None else str(ini)
    if text.strip() == "" and option.default:
        return Raw(option.default, f"default of {option.flag}", False)
    return Raw(text, f"ini option {option.ini}", False)
