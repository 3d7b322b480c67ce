"""Start the suite's inner ``python -m ...`` sessions as forks of a process that has torch.

Most tests run their scenario in a real pytest subprocess, because torch's switches
are process-global. One ``import torch`` costs about two seconds of CPU, and the
suite starts several hundred such sessions. A *zygote* imports torch (and NumPy)
once per xdist worker and does nothing else; each inner session is a fork of it,
set up as ``python -m <module> <args>`` would be: working directory, environment,
``sys.path``, ``sys.argv``, standard streams, exit code. The child's torch has
never run an op, so its switches are the defaults a fresh interpreter has.

A fork is not used, and a real process is started instead, when:

* the command is not ``<this python> -m <module> ...``, or its output is not a file;
* the environment differs from the zygote's in a variable that torch or a library
  it loads reads at import (:data:`READ_AT_IMPORT`);
* the test is marked ``fresh_interpreter`` (it is about what happens while torch is
  imported, or about torch not being imported at all);
* ``PYTEST_BACKENDS_TESTS_FORK=0`` is set.

``PYTEST_BACKENDS_TESTS_FORK_LOG=FILE`` appends, per inner session, the test's node
id and why it was not forked (``None``: it was).

``tests/unit/test_zygote.py`` checks that a forked session and a real one agree.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

#: Prefixes of the variables torch, its libraries (OpenMP, oneDNN, MKL, BLAS, the
#: allocator) and Python itself read when the interpreter starts or torch is imported:
#: a session whose environment changes one is a new interpreter.
READ_AT_IMPORT = (
    "ATEN_",
    "TORCH",
    "PYTORCH",
    "PT_",
    "CUDA",
    "CUBLAS",
    "CUDNN",
    "NCCL",
    "NVIDIA",
    "HIP",
    "ROCM",
    "OMP_",
    "GOMP_",
    "KMP_",
    "MKL",
    "DNNL",
    "ONEDNN",
    "OPENBLAS",
    "BLIS",
    "NUMEXPR",
    "NUMPY",
    "LD_",
    "MALLOC",
    "PYTHON",
    "TMP",
    "TEMP",
    "LANG",
    "LC_",
    "XDG_",
)
#: Variables with such a prefix that may still differ: pytester's ``PYTHONPATH``
#: (applied to the fork's ``sys.path``) and the compiler caches torch itself sets in
#: ``os.environ`` the first time it compiles, read only then.
FORKABLE = ("PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")

_BASE_ENV = dict(os.environ)


def unforkable(env: dict[str, str], base: dict[str, str] | None = None) -> list[str]:
    """The variables that keep a session with environment ``env`` from being a fork."""
    base = _BASE_ENV if base is None else base
    changed = set(env) ^ set(base) | {k for k in env if k in base and env[k] != base[k]}
    return sorted(k for k in changed if k.startswith(READ_AT_IMPORT) and k not in FORKABLE)


def module_command(cmdargs: Sequence[str]) -> tuple[str, list[str]] | None:
    """``(module, args)`` when ``cmdargs`` is ``<this python> -m module args...``."""
    if len(cmdargs) < 2 or cmdargs[0] != sys.executable or not cmdargs[1].startswith("-m"):
        return None
    if cmdargs[1] == "-m":
        return (cmdargs[2], list(cmdargs[3:])) if len(cmdargs) > 2 else None
    return cmdargs[1][2:], list(cmdargs[2:])


class Zygote:
    """The client side: one zygote process, started on first use."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self.busy = False

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            env = {k: v for k, v in _BASE_ENV.items() if k != "PYTHONPATH"}
            source = f"exec(compile(open({__file__!r}).read(), {__file__!r}, 'exec'))"
            self._proc = subprocess.Popen(
                [sys.executable, "-c", source, "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                cwd="/",
            )
            self._buffer = b""
        return self._proc

    def _line(self, timeout: float | None) -> str | None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        while b"\n" not in self._buffer:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError("the test zygote exited")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def spawn(
        self, module: str, args: list[str], env: dict[str, str], out: str, err: str
    ) -> Forked:
        """Fork a session running ``python -m module args``; its output goes to files."""
        proc = self._start()
        assert proc.stdin is not None
        request = {"module": module, "args": args, "env": env, "cwd": os.getcwd()}
        request.update(out=out, err=err)
        proc.stdin.write(json.dumps(request).encode() + b"\n")
        proc.stdin.flush()
        pid = self._line(None)
        assert pid is not None
        self.busy = True
        return Forked(self, int(pid), [sys.executable, "-m", module, *args])


class Forked:
    """The part of :class:`subprocess.Popen` that pytester's ``run`` uses."""

    stdin = None

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self._zygote = zygote
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the session; raise :class:`subprocess.TimeoutExpired` after ``timeout``."""
        if self.returncode is None:
            line = self._zygote._line(timeout)
            if line is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = int(line)
            self._zygote.busy = False
        return self.returncode

    def kill(self) -> None:
        """Kill the session (``SIGKILL``)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


ZYGOTE = Zygote()


def _why_not(pytester: Any, command: object, env: dict[str, str], kw: dict[str, Any]) -> str | None:
    """Why this session must be a new interpreter, or None when it may be a fork."""
    if command is None:
        return "not python -m"
    if ZYGOTE.busy:
        return "a forked session runs"
    if os.environ.get("PYTEST_BACKENDS_TESTS_FORK") == "0":
        return "PYTEST_BACKENDS_TESTS_FORK=0"
    stdin = kw.get("stdin", pytester.CLOSE_STDIN)
    if stdin is not pytester.CLOSE_STDIN or set(kw) - {"stdout", "stderr", "stdin", "close_fds"}:
        return "standard input"
    if not all(isinstance(getattr(kw.get(s), "name", None), str) for s in ("stdout", "stderr")):
        return "output not to files"
    if pytester._request.node.get_closest_marker("fresh_interpreter") is not None:
        return "marked fresh_interpreter"
    changed = unforkable(env)
    return f"environment {changed}" if changed else None


def popen_or_fork(real: Any, pytester: Any, cmdargs: Any, **kw: Any) -> Any:
    """Pytester's ``popen``, forking the zygote where the session allows it."""
    command = module_command([os.fspath(a) for a in cmdargs])
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    why = _why_not(pytester, command, env, kw)
    log = os.environ.get("PYTEST_BACKENDS_TESTS_FORK_LOG")
    if log:
        with open(log, "a") as file:
            file.write(f"{pytester._request.node.nodeid}\t{why}\n")
    if why is not None or command is None:
        return real(pytester, cmdargs, **kw)
    kw["stdout"].flush()
    kw["stderr"].flush()
    return ZYGOTE.spawn(command[0], command[1], env, kw["stdout"].name, kw["stderr"].name)


def _serve() -> None:  # pragma: no cover - runs in the zygote
    with contextlib.suppress(ImportError):
        import numpy  # noqa: F401
    import torch  # noqa: F401

    requests = os.fdopen(os.dup(0), "rb")
    replies = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    base_path = sys.path[1:]
    for raw in requests:
        request = json.loads(raw)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            requests.close()
            os.close(replies)
            _child(request, base_path)
        os.write(replies, f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        os.write(replies, f"{code}\n".encode())


def _child(request: dict[str, Any], base_path: list[str]) -> None:  # pragma: no cover
    import atexit
    import runpy
    import threading
    import traceback

    code: Any = 0
    try:
        for fd, path in ((1, request["out"]), (2, request["err"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *extra, *base_path]
        # A new interpreter seeds these from the OS; forks would share the zygote's.
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        sys.modules["torch"].default_generator.seed()
        sys.argv = ["-m", *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    _serve()
