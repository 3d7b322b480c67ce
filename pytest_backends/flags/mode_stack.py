"""How a change of the torch-function mode stack's row is named in a report.

The row (read in :mod:`.switches`, which the guard imports when idle) is
compared, written back and shown as the stack's depth. Its raw value
keeps the modes themselves, bottom first, each with whether it is the context
``torch.set_default_device`` recorded; its plain value is the depth as a
:class:`ModeStack`, an int that carries them. A report then names what the test
did: torch's ``DeviceContext`` as the default device it sets (``set_default_device``
or a ``with torch.device(...)`` left open) and how to undo it, any other mode by
its class.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from pytest_backends.flags.switches import DEVICE_ROW, ModeStack, function_stack_reader
from pytest_backends.flags.switches import STACK_ROW as ROW
from pytest_backends.flags.switches import ModeEntry as Entry

__all__ = ["DEVICE_ROW", "ROW", "ModeStack", "function_stack_reader", "stack_lines"]


def _is_device(mode: object) -> bool:
    device = sys.modules.get("torch.utils._device")  # imported wherever one exists
    cls = getattr(device, "DeviceContext", None)
    return isinstance(cls, type) and isinstance(mode, cls)


def _device(mode: object) -> str:
    return str(getattr(mode, "device", "?"))


def _default_device(modes: Sequence[Entry]) -> str:
    """The default device a stack gives, as ``torch.get_default_device()`` finds it."""
    devices = [_device(mode) for _, mode, _ in modes if _is_device(mode)]
    return devices[-1] if devices else "cpu"


def _device_line(
    before: Sequence[Entry], after: Sequence[Entry], entered: list[Entry], exited: list[Entry]
) -> str:
    old, new = _default_device(before), _default_device(after)
    how = []
    for _, mode, recorded in entered:
        device = _device(mode)
        if recorded:
            same = " (the device is the same, but its device-context mode stays)"
            how.append(
                f"torch.set_default_device({device!r}) was left set{same if old == new else ''}; "
                "undo it with torch.set_default_device(None)"
            )
        else:
            how.append(
                f"a torch.device({device!r}) context was entered and not exited; exit it, "
                f"or use `with torch.device({device!r}):` around the code that needs it"
            )
    for _, mode, recorded in exited:
        device = _device(mode)
        if recorded:
            how.append(
                f"torch.set_default_device(None) removed the default device {device!r} set "
                f"before; set it back with torch.set_default_device({device!r})"
            )
        else:
            how.append(f"a torch.device({device!r}) context entered before was exited")
    return f"  {DEVICE_ROW}: {old!r} -> {new!r} ({'; '.join(how)})"


def _names(entries: list[Entry]) -> str:
    return ", ".join(type(mode).__qualname__ for _, mode, _ in entries)


def stack_lines(diff: Mapping[str, tuple[object, object]]) -> dict[str, str]:
    """Report lines that replace the rows' own lines in ``diff``, by row name.

    For a change of the mode stack whose modes were read: torch's default-device
    contexts entered or exited become one ``default_device`` line, with the
    devices before and after and how to undo it (in place of the recorded
    device's own line, where that changed too); other modes keep the stack's
    line, which names their classes. An empty line drops the row's own line.
    """
    before, after = diff.get(ROW, (None, None))
    if not isinstance(before, ModeStack) or not isinstance(after, ModeStack):
        return {}
    ids_before = {entry[0] for entry in before.modes}
    ids_after = {entry[0] for entry in after.modes}
    entered = [e for e in after.modes if e[0] not in ids_before]
    exited = [e for e in before.modes if e[0] not in ids_after]
    if not entered and not exited:
        return {}
    parts = []
    others_in = [e for e in entered if not _is_device(e[1])]
    others_out = [e for e in exited if not _is_device(e[1])]
    if others_in:
        parts.append(f"entered and not exited: {_names(others_in)}")
    if others_out:
        parts.append(f"exited, entered before: {_names(others_out)}")
    stack = f"  {ROW}: {before!r} -> {after!r} ({'; '.join(parts)})" if parts else ""
    devices_in = [e for e in entered if _is_device(e[1])]
    devices_out = [e for e in exited if _is_device(e[1])]
    if not devices_in and not devices_out:
        return {ROW: stack}
    device = _device_line(before.modes, after.modes, devices_in, devices_out)
    if DEVICE_ROW in diff:
        return {DEVICE_ROW: device, ROW: stack}
    return {ROW: "\n".join(line for line in (device, stack) if line)}
