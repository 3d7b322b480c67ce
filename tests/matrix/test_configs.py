"""Configurations as data: ids, order, flags per torch API, device, extension."""

from __future__ import annotations

import pytest
from matrix_helpers import LEGACY_FLAGS, NEW_API_FLAGS

from pytest_backends.matrix.axes import builtin_registry
from pytest_backends.matrix.configs import Axis, AxisRegistry, AxisValue, BackendConfig, ConfigError

REG = builtin_registry()


def make(
    choices: dict[str, str], flags: frozenset[str] = NEW_API_FLAGS, cuda: bool = False
) -> BackendConfig:
    return REG.make(choices, available_flags=flags, cuda_available=cuda)


def test_builtin_axes_and_values() -> None:
    assert REG.names == (
        "cudnn",
        "cudnn_benchmark",
        "mkldnn",
        "nnpack",
        "tf32",
        "mkldnn_precision",
        "rpr",
        "sdpa",
        "deterministic",
        "device",
        "cpu_capability",
    )
    assert REG.axis("sdpa").value_names == ("math", "flash", "efficient", "cudnn")
    assert REG.axis("cpu_capability").value_names == (
        "default",
        "avx2",
        "avx512",
        "vsx",
        "zvector",
        "sve256",
    )
    assert REG.axis("cpu_capability").process_level
    assert not any(a.process_level for a in REG if a.name != "cpu_capability")


@pytest.mark.parametrize(
    ("choices", "expected"),
    [
        ({"mkldnn": "off"}, "mkldnn-off"),
        ({"tf32": "on"}, "tf32-on"),
        ({"sdpa": "flash"}, "sdpa-flash"),
        ({"device": "cuda"}, "device-cuda"),
        ({"cpu_capability": "avx2"}, "cap-avx2"),
        ({"sdpa": "math", "cudnn": "off"}, "cudnn-off,sdpa-math"),
        (
            {"device": "cpu", "mkldnn_precision": "bf16", "mkldnn": "on"},
            "mkldnn-on,mkldnn_precision-bf16,device-cpu",
        ),
        ({}, "default"),
    ],
)
def test_ids_are_readable_and_in_axis_order(choices: dict[str, str], expected: str) -> None:
    assert make(choices).id == expected


def test_every_id_of_the_full_product_is_unique_and_parses_back() -> None:
    selection = {a.name: a.value_names for a in REG if a.name != "cpu_capability"}
    combos = REG.product(selection)
    ids = [make(dict(c)).id for c in combos]
    assert len(ids) == len(set(ids)) == 2 * 2 * 2 * 2 * 2 * 3 * 2 * 4 * 2 * 3
    for combo, config_id in zip(combos[::97], ids[::97]):
        assert REG.parse_id(config_id) == combo


def test_product_order_ignores_selection_order() -> None:
    a = REG.product({"sdpa": ["flash", "math"], "mkldnn": ["off", "on"]})
    assert a == [
        (("mkldnn", "on"), ("sdpa", "math")),
        (("mkldnn", "on"), ("sdpa", "flash")),
        (("mkldnn", "off"), ("sdpa", "math")),
        (("mkldnn", "off"), ("sdpa", "flash")),
    ]


def test_configs_are_frozen_hashable_and_compare_by_choices() -> None:
    a, b = make({"mkldnn": "off"}), make({"mkldnn": "off"}, flags=LEGACY_FLAGS)
    assert a == b and hash(a) == hash(b)
    assert len({a, b, make({"mkldnn": "on"})}) == 2
    with pytest.raises(AttributeError):
        a.device = "cuda"  # type: ignore[misc]
    assert dict(a.axes) == {"mkldnn": "off"}
    assert str(a) == "mkldnn-off"


def test_on_off_flags() -> None:
    assert dict(make({"mkldnn": "off"}).flags) == {"mkldnn.enabled": False}
    assert dict(make({"cudnn": "on", "nnpack": "off"}).flags) == {
        "cudnn.enabled": True,
        "nnpack.enabled": False,
    }
    assert dict(make({"cudnn_benchmark": "on"}).flags) == {"cudnn.benchmark": True}


def test_tf32_uses_fp32_precision_where_it_exists_and_legacy_switches_elsewhere() -> None:
    assert dict(make({"tf32": "on"}).flags) == {
        "cuda.matmul.fp32_precision": "tf32",
        "cudnn.conv.fp32_precision": "tf32",
        "cudnn.rnn.fp32_precision": "tf32",
    }
    assert dict(make({"tf32": "off"}).flags)["cuda.matmul.fp32_precision"] == "ieee"
    assert dict(make({"tf32": "on"}, flags=LEGACY_FLAGS).flags) == {
        "cuda.matmul.allow_tf32": True,
        "cudnn.allow_tf32": True,
    }


def test_mkldnn_precision_sets_the_per_op_strings_not_the_generic_one() -> None:
    flags = dict(make({"mkldnn_precision": "bf16"}).flags)
    assert flags == {
        "mkldnn.matmul.fp32_precision": "bf16",
        "mkldnn.conv.fp32_precision": "bf16",
        "mkldnn.rnn.fp32_precision": "bf16",
    }


@pytest.mark.parametrize(
    ("value", "enabled"),
    [
        ("math", "sdp.math"),
        ("flash", "sdp.flash"),
        ("efficient", "sdp.mem_efficient"),
        ("cudnn", "sdp.cudnn"),
    ],
)
def test_sdpa_enables_exactly_one_kernel(value: str, enabled: str) -> None:
    flags = dict(make({"sdpa": value}).flags)
    assert [name for name, on in flags.items() if on] == [enabled]
    assert set(flags) == {"sdp.flash", "sdp.mem_efficient", "sdp.math", "sdp.cudnn"}


def test_rpr_and_deterministic_flags() -> None:
    assert dict(make({"rpr": "off"}).flags) == {
        "cuda.matmul.allow_fp16_reduced_precision_reduction": False,
        "cuda.matmul.allow_bf16_reduced_precision_reduction": False,
    }
    assert dict(make({"deterministic": "on"}).flags) == {
        "deterministic_algorithms": True,
        "deterministic_algorithms.warn_only": False,
        "cudnn.deterministic": True,
        "mkldnn.deterministic": True,
    }


def test_device_and_process_axes_set_no_flags() -> None:
    config = make({"device": "cuda", "cpu_capability": "avx2"})
    assert dict(config.flags) == {}
    assert dict(config.process_level) == {"cpu_capability": "avx2"}


@pytest.mark.parametrize(
    ("choices", "cuda", "device"),
    [
        ({"device": "mps"}, True, "mps"),
        ({"cudnn": "on"}, False, "cuda"),  # a CUDA-only value fixes the device
        ({"cudnn": "off"}, False, "cpu"),
        ({"cudnn": "off"}, True, "cuda"),  # GPU-side axes run on the GPU when there is one
        ({"sdpa": "flash"}, True, "cuda"),
        ({"mkldnn": "off"}, True, "cpu"),
        ({"mkldnn": "off", "sdpa": "math"}, True, "cpu"),  # mixed homes: the CPU
        ({"deterministic": "on"}, True, "cpu"),
    ],
)
def test_device_inference(choices: dict[str, str], cuda: bool, device: str) -> None:
    assert make(choices, cuda=cuda).device == device


def test_unknown_axis_or_value() -> None:
    with pytest.raises(ConfigError, match="unknown axis 'mkldn'"):
        make({"mkldn": "on"})
    with pytest.raises(ConfigError, match="axis 'sdpa' has no value 'fast'"):
        make({"sdpa": "fast"})
    with pytest.raises(ConfigError, match="not a configuration token"):
        REG.parse_id("sdpa-fast")


def _fastpath() -> Axis:
    return Axis(
        "fastpath",
        (
            AxisValue("on", "fast path", {"mha.fastpath_enabled": True}),
            AxisValue("off", "no fast path", {"mha.fastpath_enabled": False}),
        ),
        "the MHA fast path",
    )


def test_extension_appends_axes_and_values_without_changing_builtin_ids() -> None:
    extra = REG.extended(
        [
            _fastpath(),
            Axis("sdpa", (AxisValue("fa3", "FA3 only", {"sdp.fa3": True}),), "ignored"),
        ]
    )
    assert extra.names[-1] == "fastpath"
    assert extra.axis("sdpa").value_names[-1] == "fa3"
    config = extra.make(
        {"fastpath": "off", "mkldnn": "on"}, available_flags=NEW_API_FLAGS, cuda_available=False
    )
    assert config.id == "mkldnn-on,fastpath-off"
    assert dict(config.flags) == {"mkldnn.enabled": True, "mha.fastpath_enabled": False}


def test_extension_rejects_clashes_and_non_axes() -> None:
    with pytest.raises(ConfigError, match="already has values"):
        REG.extended([Axis("mkldnn", (AxisValue("on", "again"),), "dup")])
    with pytest.raises(ConfigError, match="must return Axis objects"):
        REG.extended(["mkldnn"])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="share the id prefix"):
        AxisRegistry([*REG, Axis("capx", (AxisValue("a", "a"),), "x", id_prefix="cap")])


def test_conflicting_flags_are_an_error() -> None:
    registry = REG.extended(
        [Axis("fast", (AxisValue("on", "x", {"mkldnn.enabled": True}),), "conflicts with mkldnn")]
    )
    with pytest.raises(ConfigError, match=r"mkldnn-off and fast-on set flag 'mkldnn\.enabled'"):
        registry.make(
            {"mkldnn": "off", "fast": "on"}, available_flags=NEW_API_FLAGS, cuda_available=False
        )


@pytest.mark.parametrize(
    ("name", "values", "message"),
    [
        ("Bad", ("on",), "invalid axis name"),
        ("ok", (), "has no values"),
        ("ok", ("on", "on"), "repeats values"),
        ("ok", ("o-n",), "invalid axis value name"),
    ],
)
def test_axis_validation(name: str, values: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Axis(name, tuple(AxisValue(v, v) for v in values), "doc")


def test_every_value_sets_real_flags_in_this_torch() -> None:
    import torch  # noqa: F401  (the registry needs it)

    from pytest_backends.flags import override_flags, snapshot_flags
    from pytest_backends.matrix.availability import probe

    avail = probe()
    checked = 0
    for axis in REG:
        for value in axis.value_names:
            config = make({axis.name: value}, flags=avail.flags, cuda=avail.cuda)
            if any(name not in avail.flags for name in axis.value(value).needs_flags):
                continue
            with override_flags(config.flags):
                now = snapshot_flags()
                for name, wanted in config.flags.items():
                    if name in now:  # legacy aliases are not snapshot rows
                        assert now[name] == wanted or now[name] == (wanted, True), (name, now[name])
            checked += 1
    assert checked >= 25
