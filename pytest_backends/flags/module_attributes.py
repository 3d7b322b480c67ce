"""Attributes a test sets on the ``torch.backends`` modules themselves.

``torch.backends.cudnn.enabled`` is a property that writes torch's switch. On a
plain module such as ``torch.backends.nnpack`` (whose switch is ``set_flags``),
``torch.backends.nnpack.enabled = False`` only adds a module attribute that
torch never reads, and ``torch.backends.cuda.flash_sdp_enabled = False``
replaces a function with a bool. Either stays for every later test, and the
first one looks as if it had turned NNPACK off.

The ``backends.module_attributes`` row fingerprints the public attributes of
every loaded ``torch.backends`` module by identity (cheap: a dict copy per
module), so that a test adding, replacing or deleting one is reported, and its
writer puts the objects back. Its plain value lists what differs from torch's
own modules (empty for torch as imported). A submodule's import (an attribute
``torch.backends.x`` that is the module ``torch.backends.x``) and private names
(torch's lazy caches) are not compared.

Between two reads the modules are rarely written, so the reader first reads each
module dict's *version tag* (CPython's ``ma_version_tag``, which every write of
a dict moves above every tag before it): while their sum is that of the last
read, no module was written and its state is returned without comparing the
dicts. The tag is used only where a probe, once per process, proves that
writes move it and reads do not (:func:`version_reader`); elsewhere the dicts are
compared as before. Where the native extension is loaded, the tags are summed
by its ``version_sum`` (one C loop) rather than through a Python memory view.
"""

from __future__ import annotations

import functools
import operator
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from pytest_backends.flags.row import Invalid

__all__ = ["ROW", "module_attribute_row", "probe_offset", "version_offset", "version_reader"]

ROW = "backends.module_attributes"
_DELETED = object()


class _State:
    """The attributes of every loaded ``torch.backends`` module, as read.

    Equal when every module holds the same names with the same (or equal)
    values: dict equality, which takes identical objects as equal without
    comparing them. A value whose comparison raises (a tensor) is a change.
    """

    __slots__ = ("copies", "modules")

    def __init__(self, modules: tuple[types.ModuleType, ...], copies: list[dict[str, object]]):
        self.modules = modules
        self.copies = copies

    @property
    def items(self) -> list[tuple[types.ModuleType, dict[str, object]]]:
        """Each module with its attributes as read."""
        return list(zip(self.modules, self.copies, strict=True))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _State):
            return False
        try:
            return self.modules == other.modules and self.copies == other.copies
        except Exception:  # a value without a boolean equality
            return False

    def __hash__(self) -> int:
        return len(self.modules)


def probe_offset(offset: int) -> bool:
    """Whether the uint64 at ``offset`` in a dict grows at each write of it, and only then.

    Each kind of write (a new name, a new value under a name, ``update``,
    ``setdefault``, ``pop``, ``del``) must move it above every value seen before;
    reads of the dict and writes of another dict must leave it.
    """
    import ctypes

    module = types.ModuleType("pytest_backends_dict_version_probe")
    attrs = vars(module)
    other: dict[str, object] = {}
    tag = ctypes.c_uint64.from_address(id(attrs) + offset)
    seen = tag.value
    writes: tuple[Callable[[], object], ...] = (
        lambda: setattr(module, "probe", object()),
        lambda: setattr(module, "probe", object()),
        lambda: attrs.update(probe=object()),
        lambda: delattr(module, "probe"),
        lambda: attrs.setdefault("probe", object()),
        lambda: attrs.pop("probe"),
    )
    for write in writes:
        write()
        value = tag.value
        if value <= seen:
            return False
        seen = value
        _ = (len(attrs), attrs.get("probe"), dict(attrs), attrs == other)
        other[str(value)] = object()
        if tag.value != value:
            return False
    return True


@functools.cache
def version_offset() -> int | None:
    """Where a dict keeps its version tag in this interpreter, once proved; else None.

    CPython's ``PyDictObject`` holds ``ma_version_tag`` after the object header
    and ``ma_used`` (3.10 to 3.13), taken from a global counter at each write;
    an interpreter or build where the probe fails (another layout, a tag that
    writes do not move up) compares the dicts instead.
    """
    if sys.implementation.name != "cpython" or "t" in getattr(sys, "abiflags", ""):  # free-threaded
        return None
    try:
        import ctypes

        offset = 2 * ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)
        return offset if probe_offset(offset) else None
    except Exception:  # no ctypes, or an unusual build: compare the dicts
        return None


def version_reader(dicts: Sequence[dict[str, Any]]) -> Callable[[], int] | None:
    """A reader of the sum of the version tags of ``dicts``: it grows at each write of one.

    Each tag only grows, and grows at every write of its dict (proved by
    :func:`version_offset`), so the sum is unchanged exactly while no dict was
    written. None where the tag is not proved. The reader holds the dicts, so the
    addresses it reads stay theirs; it reads the tags through one view of the memory
    that spans them (only the tags are ever read), one C call for all of them.
    """
    offset = version_offset()
    if offset is None or not dicts:
        return None
    import ctypes

    held = tuple(dicts)
    native = _native_sum(held, offset)
    if native is not None:
        return native
    at = [id(d) + offset for d in held]
    base = min(at)
    memory = (ctypes.c_char * (max(at) - base + 8)).from_address(base)
    tags = memoryview(memory).cast("B").cast("Q")
    indices = [(a - base) // 8 for a in at]
    if len(indices) == 1:  # itemgetter gives a tuple for two indices or more
        indices.append(indices[0])
    picked = operator.itemgetter(*indices)

    def read(*, _held: tuple[dict[str, Any], ...] = held) -> int:  # holds the dicts
        return sum(picked(tags))

    return read


def _native_sum(held: tuple[dict[str, Any], ...], offset: int) -> Callable[[], int] | None:
    """The native extension's reader of the same sum, where it is loaded already.

    It reads the tags in one C loop, without a Python int per tag (a quarter of the
    cost); the partial holds the dicts. Never loads or builds the extension.
    """
    from pytest_backends import _native

    module = _native.load_cached() if _native.loaded() else None
    version_sum = getattr(module, "version_sum", None)
    if version_sum is None:
        return None
    read: Callable[[], int] = functools.partial(version_sum, held, offset)
    import ctypes

    direct = sum(ctypes.c_uint64.from_address(id(d) + offset).value for d in held)
    return read if read() == direct else None


def _submodule(owner: types.ModuleType, name: str, value: object) -> bool:
    """Whether ``owner.name`` is the imported submodule ``owner.__name__ + '.' + name``."""
    return isinstance(value, types.ModuleType) and value.__name__ == f"{owner.__name__}.{name}"


def _modules(root: types.ModuleType) -> Iterator[types.ModuleType]:
    """``torch.backends`` and its imported submodules, depth first."""
    todo = [root]
    while todo:
        module = todo.pop()
        yield module
        todo.extend(v for k, v in vars(module).items() if _submodule(module, k, v))


def _public(
    module: types.ModuleType, attrs: dict[str, object], owned: frozenset[tuple[int, str]]
) -> dict[str, object]:
    """The attributes this row compares: public, no submodule, no switch.

    A name the module's type defines (a property of torch's ``PropModule``) is
    a switch, and so is an attribute another row reads (``owned``: ``id(module)``
    and name, ``torch.backends.opt_einsum.enabled``); those are their rows'.
    """
    kind = type(module)
    return {
        k: v
        for k, v in attrs.items()
        if not k.startswith("_")
        and not _submodule(module, k, v)
        and not hasattr(kind, k)
        and (id(module), k) not in owned
    }


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def module_attribute_row(
    torch: Any, owned: Iterable[tuple[object, str]] = ()
) -> tuple[Callable[[], object], Callable[[Any], None], Any]:
    """The reader, writer and plain conversion of the ``backends.module_attributes`` row.

    What torch's modules hold when the row is built (at torch's import, before
    user code) is torch's own; a module imported later is torch's as first seen.
    ``owned`` lists the (module, attribute) pairs other rows read and write.
    """
    root = torch.backends
    owned_ids = frozenset((id(module), attr) for module, attr in owned)

    def public(module: types.ModuleType, attrs: dict[str, object]) -> dict[str, object]:
        return _public(module, attrs, owned_ids)

    original: dict[str, tuple[types.ModuleType, dict[str, object]]] = {}
    built = {m.__name__: dict(vars(m)) for m in _modules(root)}
    #: description -> (module name, attribute, object or _DELETED), for the writer
    seen: dict[str, tuple[str, str, object]] = {}

    # the modules, walked again only when one of them gains or loses an attribute
    # (a submodule import adds one to its parent): the walk is the costly part
    # (modules, their attribute dicts, the dicts' sizes, their version tags' reader); a
    # module's dict is the same object for its life, so only the copies are made on each read
    Walk = tuple[
        tuple[types.ModuleType, ...],
        list[dict[str, Any]],
        tuple[int, ...],
        Callable[[], int] | None,
    ]
    walked: list[Walk] = [((), [], (), None)]

    # the state last read, with the dicts' version tags when they last equalled its
    # copies: while the tags are unchanged no dict was written and the state is
    # returned again without a comparison; while the dicts equal its copies it is
    # returned again for one comparison and no copy. The guard's comparisons of two
    # fingerprints holding it stop at its identity.
    last: list[tuple[_State, int | None] | None] = [None]

    def read() -> object:
        modules, dicts, sizes, versions = walked[0]
        tags = versions() if versions is not None else None  # before the dicts are read
        known = last[0]
        if known is not None and known[0].modules is modules:
            state, seen = known
            if tags is not None and tags == seen:
                return state
            try:
                if dicts == state.copies:
                    last[0] = (state, tags)
                    return state
            except Exception:  # a value without a boolean equality: read afresh
                pass
        copies = [d.copy() for d in dicts]
        if not modules or tuple(map(len, copies)) != sizes:
            modules = tuple(_modules(root))
            dicts = [vars(m) for m in modules]
            versions = version_reader(dicts)
            tags = versions() if versions is not None else None
            copies = [d.copy() for d in dicts]
            walked[0] = (modules, dicts, tuple(map(len, copies)), versions)
        state = _State(modules, copies)
        last[0] = (state, tags)
        return state

    def own(module: types.ModuleType, attrs: dict[str, object]) -> dict[str, object]:
        if module.__name__ not in original:
            at_build = built.get(module.__name__)
            original[module.__name__] = (module, public(module, at_build or attrs))
        return original[module.__name__][1]

    def plain(state: object) -> object:
        assert isinstance(state, _State)
        out: list[str] = []
        for module, attrs in state.items:
            name, base, now = module.__name__, own(module, attrs), public(module, attrs)
            for attr in sorted(set(base) | set(now)):
                value = now.get(attr, _DELETED)
                if value is base.get(attr, _DELETED):
                    continue
                if value is _DELETED:
                    desc = f"del {name}.{attr}"
                elif attr in base:
                    desc = f"{name}.{attr} = {_short(value)} (torch's: {_short(base[attr])})"
                elif isinstance(sys.modules.get(f"{name}.{attr}"), types.ModuleType):
                    desc = f"{name}.{attr} = {_short(value)} (torch's: the module {name}.{attr})"
                else:
                    desc = (
                        f"{name}.{attr} = {_short(value)} (no such attribute: torch never reads it)"
                    )
                seen[desc] = (name, attr, value)
                out.append(desc)
        return out

    def write(want: object) -> None:
        wanted = {seen[d][:2]: seen[d][2] for d in descriptions(want)}
        for module in list(_modules(root)):
            name = module.__name__
            base = own(module, dict(vars(module)))
            now = public(module, dict(vars(module)))
            for attr in set(base) | set(now) | {a for m, a in wanted if m == name}:
                target = wanted.get((name, attr), base.get(attr, _DELETED))
                if target is _DELETED:
                    imported = sys.modules.get(f"{name}.{attr}")
                    if isinstance(imported, types.ModuleType):
                        target = imported  # never delete a submodule a test replaced
                if target is _DELETED:
                    if attr in now:
                        delattr(module, attr)
                elif getattr(module, attr, _DELETED) is not target:
                    setattr(module, attr, target)

    def descriptions(value: object) -> list[str]:
        if isinstance(value, (list, tuple)) and all(v in seen for v in value):
            return list(value)
        raise Invalid(
            "this row is restored by the guard only (it holds objects); expected [] for "
            f"torch's own attributes, got {value!r}"
        )

    def check(value: object) -> object:
        return descriptions(value)

    return read, write, (plain, check)
