"""The floor of the native recorder's hook: what reaching each op costs before any recording.

The native recorder sees ops through a boxed dispatcher fallback on a dispatch
key no torch op uses (``native/recorder.cpp``). This benchmark compares that
hook, stripped of all recording, with the ``RecordFunction`` callback the
recorder used before, also stripped (it asks for inputs and outputs, as a
recorder must, and does nothing with them), on the small-op suite's RK4 body
(``bench_suite_determinism.ode_body``). Both hooks are built here with
``torch.utils.cpp_extension.load_inline``; the package's extension is not
loaded (it registers the same fallback). The callback sees every dispatcher
call, the calls nested inside a recorded op included; the fallback sees the
recorded ops only. Variants run interleaved in this process; the best of the
repeats, in microseconds per recorded op (thread CPU time), is reported with
the bare op beside it.

Usage::

    python benchmarks/bench_hook_floor.py [--repeat 30] [--out PATH]

Results go to stdout and ``benchmarks/results/hook-floor-cpu.txt``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.append(str(Path(__file__).resolve().parent))  # bench_machine, bench_suite_determinism
from bench_machine import describe, write_result

OUT = Path(__file__).parent / "results" / "hook-floor-cpu.txt"

HOOKS = r"""
#include <torch/extension.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace {

constexpr c10::DispatchKey kKey = c10::DispatchKey::DeferredInit;
at::CallbackHandle g_handle = 0;
int64_t g_seen = 0;
std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction&) {
  ++g_seen;  // every call, the calls nested inside another included
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {}

void fallback(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto below = keys & c10::DispatchKeySet(c10::DispatchKeySet::FULL_AFTER, kKey);
  if (op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd)) {
    op.redispatchBoxed(below, stack);
    return;
  }
  ++g_seen;
  c10::impl::ExcludeDispatchKeyGuard nested(kKey);
  op.redispatchBoxed(below, stack);
}

}  // namespace

void register_fallback() {
  auto& dispatcher = c10::Dispatcher::singleton();
  static auto* handle = new c10::RegistrationHandleRAII(dispatcher.registerFallback(
      kKey, c10::KernelFunction::makeFromBoxedFunction<&fallback>(), "hook floor benchmark"));
  (void)handle;
}

void callback_start() {
  g_seen = 0;
  g_handle = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_start, &on_end)
                                            .needsInputs(true)
                                            .needsOutputs(true)
                                            .scopes({at::RecordScope::FUNCTION}));
}

int64_t callback_stop() {
  at::removeCallback(g_handle);
  return g_seen;
}

void fallback_start() {
  g_seen = 0;
  c10::impl::tls_set_dispatch_key_excluded(kKey, false);
  c10::impl::tls_set_dispatch_key_included(kKey, true);
}

int64_t fallback_stop() {
  c10::impl::tls_set_dispatch_key_included(kKey, false);
  return g_seen;
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    import torch
    from bench_reproducible import FEATURES
    from bench_suite_determinism import ode_body
    from torch.utils.cpp_extension import load_inline

    torch.set_num_threads(1)
    hooks: Any = load_inline(
        "pytest_backends_hook_floor",
        cpp_sources=[HOOKS],
        functions=[
            "register_fallback",
            "callback_start",
            "callback_stop",
            "fallback_start",
            "fallback_stop",
        ],
        extra_cflags=["-O3", "-DNDEBUG"],
    )
    hooks.register_fallback()
    body = ode_body()

    hooks.callback_start()
    body()
    calls = hooks.callback_stop()
    hooks.fallback_start()
    body()
    ops = hooks.fallback_stop()

    def callback() -> None:
        hooks.callback_start()
        body()
        hooks.callback_stop()

    def fallback() -> None:
        hooks.fallback_start()
        body()
        hooks.fallback_stop()

    variants: dict[str, Callable[[], object]] = {
        "bare": body,
        "RecordFunction callback (inputs and outputs)": callback,
        "dispatcher fallback": fallback,
    }
    best = dict.fromkeys(variants, 1e9)
    for _ in range(args.repeat):
        for name, fn in variants.items():
            start = time.thread_time()
            for _ in range(5):
                fn()
            best[name] = min(best[name], (time.thread_time() - start) / 5)
    per_op = {name: seconds / ops * 1e6 for name, seconds in best.items()}
    bare = per_op["bare"]
    lines = [
        "The native recorder's hook, stripped of recording, on the RK4 body of the small-op suite "
        f"({ops} recorded ops per run, {calls} dispatcher calls with the nested ones; best of "
        f"{args.repeat} interleaved repeats of 5 runs, 1 thread, thread CPU time)",
        f"CPU: {describe(FEATURES)}; torch {torch.__version__}",
        "",
    ]
    for name, us in per_op.items():
        extra = "" if name == "bare" else f" | +{us - bare:.2f} us per op over bare"
        lines.append(f"  {name:45s} {us:6.2f} us per op{extra}")
    write_result("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
