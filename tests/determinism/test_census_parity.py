"""Both recorders write the same census for ordinary training code.

Each case runs one pytester session under the native recorder and one under
the Python recorder (``PYTEST_BACKENDS_NATIVE=off``) and compares the census
files row by row: per test, the op, device, dtype and verdict, and the "not
checked" and boundary maps. A baseline made on a job with the native recorder
must hold on a job without a compiler, and a merged census must not list one
op twice under two names.

Ops are compared by their family (:func:`~pytest_backends.determinism.census.op_family`):
while a Python dispatch mode is active, torch's backward formulas and gradient
accumulation take an op's out-of-place form (``aten::sub`` for ``aten::sub_``),
which the baseline already treats as one op.
"""

from __future__ import annotations

import json

import pytest
from sessions import RECORDERS, session

from pytest_backends.determinism.census import op_family

ORDINARY = """
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def test_mlp_sgd_cross_entropy():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.ones(5, 8), torch.tensor([0, 1, 2, 3, 0])
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


@pytest.mark.parametrize("kind", ["foreach", "fused"])
def test_mlp_adamw(kind):
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, **{kind: True})
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(5, 8)).pow(2).mean().backward()
        opt.step()


def test_conv_batchnorm_channels_last():
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 2),
    ).to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    F.cross_entropy(net(x), torch.tensor([0, 1])).backward()


def test_embedding_index_add_scatter_add():
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4)
    idx = torch.tensor([1, 2, 2, 7])
    out = emb(idx)
    out.sum().backward()
    torch.zeros(10, 4).index_add_(0, idx, out.detach())
    torch.zeros(10, 4).scatter_add(0, idx[:, None].expand(4, 4), out.detach())


def test_dataloader_loop():
    ds = TensorDataset(torch.arange(16.0).reshape(8, 2), torch.arange(8) % 3)
    model = nn.Linear(2, 3)
    loader = DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    for x, y in loader:
        F.cross_entropy(model(x), y).backward()


def test_in_place_ops():
    x = torch.ones(4, 4)
    x.add_(1).mul_(2).clamp_(0, 3)
    x[0] = 5
    x.masked_fill_(x > 4, 0)
    w = torch.ones(3, requires_grad=True)
    z = w * 2
    z.mul_(3)
    z.sum().backward()


def test_dropout_seeded_generator():
    g = torch.Generator().manual_seed(0)
    x = torch.ones(8, 8, requires_grad=True)
    torch.manual_seed(0)
    (F.dropout(x, 0.5, training=True) * torch.rand(8, 8, generator=g)).sum().backward()


def test_integer_ops():
    a = torch.arange(10)
    b = (a * 3) // 2 % 4
    torch.bincount(b), torch.cumsum(a & 3, 0), torch.sort(b), torch.argmax(a)


def test_func_grad():
    x = torch.linspace(-1, 1, 5)
    torch.func.grad(lambda v: (v.sin() ** 2).sum())(x)
"""

FORWARD_AD = """
import torch
import torch.autograd.forward_ad as fwAD


def test_forward_ad():
    with fwAD.dual_level():
        dual = fwAD.make_dual(torch.ones(3), torch.ones(3))
        fwAD.unpack_dual((dual.sin() * 2).sum()).tangent


def test_jvp_and_hessian():
    f = lambda x: (x.sin() * x).sum()
    torch.func.jvp(f, (torch.ones(3),), (torch.ones(3),))
    torch.func.hessian(f)(torch.ones(3))
"""


def _census(pytester: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    result = session(
        pytester,
        recorder,
        monkeypatch,
        "--backends-determinism-all",
        "--backends-determinism=2",
        f"--backends-census={recorder}.json",
        "-W",
        "ignore::UserWarning",
    )
    assert result.ret == 0, result.stdout.str()[-3000:]
    data: dict = json.loads((pytester.path / f"{recorder}.json").read_text(encoding="utf-8"))
    return data


def _rows(census: dict) -> set[tuple[str, str, str | None, str | None, str]]:
    return {
        (test, op_family(row["op"]), row["device"], row["dtype"], row["verdict"])
        for row in census["entries"]
        for test in row["tests"]
    }


def test_ordinary_training_code_gives_equal_census_rows(
    planted_conftest: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No row only one recorder writes (``aten::detach_`` from ``torch.tensor`` was native only)."""
    planted_conftest.makepyfile(test_ordinary="import pytest\n" + ORDINARY)
    native, python = (_census(planted_conftest, r, monkeypatch) for r in RECORDERS)
    assert len({nodeid for row in native["entries"] for nodeid in row["tests"]}) == 10
    only_native, only_python = _rows(native) - _rows(python), _rows(python) - _rows(native)
    assert not only_native and not only_python, (sorted(only_native), sorted(only_python))
    assert native["not_checked"] == python["not_checked"] == {}
    assert native["boundary"] == python["boundary"]
    assert not any(row["op"] == "aten::detach_" for row in native["entries"])


@pytest.mark.parametrize("recorder", RECORDERS)
def test_forward_ad_is_checked_by_both_recorders(
    planted_conftest: pytest.Pytester, recorder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forward AD's zero tangents (ZeroTensors) crashed the Python recorder's process."""
    planted_conftest.makepyfile(test_forward=FORWARD_AD)
    census = _census(planted_conftest, recorder, monkeypatch)
    tested = {nodeid for row in census["entries"] for nodeid in row["tests"]}
    assert tested == {"test_forward.py::test_forward_ad", "test_forward.py::test_jvp_and_hessian"}
    assert census["not_checked"] == {}
    assert not {row["op"] for row in census["entries"]} & {"aten::_make_dual", "aten::_fw_primal"}
