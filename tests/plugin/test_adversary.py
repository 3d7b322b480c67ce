"""The adversary: every setting beyond the backend flags that a test can change.

One real pytest session (``runpytest_subprocess``) runs, for each setting, a test
that changes it through torch's own API and never restores it, then a test that
asserts torch's default.  Each change must be reported by name in the first test's
warning, and every follow-up test must pass.  Settings that do not exist in the
running torch are skipped with the registry's reason.
"""

from __future__ import annotations

import textwrap

import pytest
import torch  # here, not inside a test: pytester drops modules a test imports

from pytest_backends.flags import registry

pytest_plugins = ["pytester"]

_HEADER = """
import collections
import mmap

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.utils.checkpoint
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_backends.flags import registry

KEEP = []  # contexts a test enters and never exits stay alive


class PassThrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))
"""

C = "torch._C"
# row -> (code that changes it and never restores it, code that asserts the default)
PAIRS: dict[str, tuple[str, str]] = {
    "autograd.grad_layout_enforcement": (
        f"{C}._set_grad_layout_enforcement_enabled(False)",
        f"assert {C}._is_grad_layout_enforcement_enabled()",
    ),
    "autograd.override_stale_capture_stream": (
        "torch.autograd.graph.set_override_stale_capture_stream(True)",
        f"assert not {C}._override_stale_capture_stream()",
    ),
    "autograd.warn_on_accumulate_grad_stream_mismatch": (
        "torch.autograd.graph.set_warn_on_accumulate_grad_stream_mismatch(False)",
        f"assert {C}._warn_on_accumulate_grad_stream_mismatch()",
    ),
    "autograd.fallback_mode": (
        f'{C}._set_autograd_fallback_mode("nothing")',
        f'assert {C}._get_autograd_fallback_mode() == "warn"',
    ),
    "sm_carveout": (
        f"{C}._set_sm_carveout_experimental(4)",
        f"assert {C}._get_sm_carveout_experimental() is None",
    ),
    "backcompat.broadcast_warn": (
        "torch.utils.backcompat.broadcast_warning.enabled = True",
        "assert not torch.utils.backcompat.broadcast_warning.enabled",
    ),
    "backcompat.keepdim_warn": (
        "torch.utils.backcompat.keepdim_warning.enabled = True",
        "assert not torch.utils.backcompat.keepdim_warning.enabled",
    ),
    "functorch.vmap_fallback_enabled": (
        f"{C}._functorch._set_vmap_fallback_enabled(False)",
        f"assert {C}._functorch._is_vmap_fallback_enabled()",
    ),
    "future.overwrite_module_params_on_conversion": (
        "torch.__future__.set_overwrite_module_params_on_conversion(True)",
        "assert not torch.__future__.get_overwrite_module_params_on_conversion()",
    ),
    "future.swap_module_params_on_conversion": (
        "torch.__future__.set_swap_module_params_on_conversion(True)",
        "assert not torch.__future__.get_swap_module_params_on_conversion()",
    ),
    "storage.always_warn_typed_storage_removal": (
        "torch.storage._set_always_warn_typed_storage_removal(True)",
        "assert not torch.storage._get_always_warn_typed_storage_removal()",
    ),
    "jit.onednn_fusion": (
        "torch.jit.enable_onednn_fusion(True)",
        "assert not torch.jit.onednn_fusion_enabled()",
    ),
    "jit.texpr_reductions": (
        f"{C}._jit_set_texpr_reductions_enabled(True)",
        f"assert not {C}._jit_texpr_reductions_enabled()",
    ),
    "jit.texpr_dynamic_shape": (
        f"{C}._jit_set_texpr_dynamic_shape_enabled(True)",
        f"assert not {C}._jit_texpr_dynamic_shape_enabled()",
    ),
    "jit.num_profiled_runs": (
        f"{C}._jit_set_num_profiled_runs(5)",
        f"assert {C}._jit_get_num_profiled_runs() == 1",
    ),
    "jit.inline_everything_mode": (
        f"{C}._jit_set_inline_everything_mode(True)",
        f"assert not {C}._jit_get_inline_everything_mode()",
    ),
    "jit.tracer_state_warn": (
        f"{C}._jit_set_tracer_state_warn(False)",
        f"assert {C}._jit_get_tracer_state_warn()",
    ),
    "jit.te_must_use_llvm_cpu": (
        f"{C}._jit_set_te_must_use_llvm_cpu(False)",
        f"assert {C}._jit_get_te_must_use_llvm_cpu()",
    ),
    "jit.te_generate_block_code": (
        f"{C}._jit_set_te_generate_block_code(True)",
        f"assert not {C}._jit_get_te_generate_block_code()",
    ),
    "jit.te_cuda_pointwise_loop_levels": (
        f"{C}._jit_set_te_cuda_pointwise_loop_levels(3)",
        f"assert {C}._jit_get_te_cuda_pointwise_loop_levels() == -1",
    ),
    "jit.logging_option": (
        f'{C}._jit_set_logging_option("fuser")',
        f'assert {C}._jit_get_logging_option() == ""',
    ),
    "multiprocessing.sharing_strategy": (
        'torch.multiprocessing.set_sharing_strategy("file_system")',
        'assert torch.multiprocessing.get_sharing_strategy() == "file_descriptor"',
    ),
    "serialization.load.mmap": (
        "torch.utils.serialization.config.load.mmap = True",
        "assert torch.utils.serialization.config.load.mmap is False",
    ),
    "serialization.load.endianness": (
        "torch.serialization.set_default_load_endianness(torch.serialization.LoadEndianness.BIG)",
        "assert torch.serialization.get_default_load_endianness() is None",
    ),
    "serialization.load.mmap_flags": (
        "torch.serialization.set_default_mmap_options(mmap.MAP_SHARED)",
        "assert torch.utils.serialization.config.load.mmap_flags == mmap.MAP_PRIVATE",
    ),
    "serialization.save.compute_crc32": (
        "torch.serialization.set_crc32_options(False)",
        "assert torch.utils.serialization.config.save.compute_crc32 is True",
    ),
    "serialization.safe_globals": (
        "torch.serialization.add_safe_globals([collections.OrderedDict])",
        "assert collections.OrderedDict not in torch.serialization.get_safe_globals()",
    ),
    "autocast.xla.enabled": (
        'torch.set_autocast_enabled("xla", True)',
        'assert not torch.is_autocast_enabled("xla")',
    ),
    "autocast.hpu.dtype": (
        'torch.set_autocast_dtype("hpu", torch.float16)',
        'assert torch.get_autocast_dtype("hpu") == torch.bfloat16',
    ),
    "autograd.inference_mode": (
        """
        ctx = torch.inference_mode()
        ctx.__enter__()  # never exited
        KEEP.append(ctx)
        """,
        """
        x = torch.ones(3, requires_grad=True)
        (x * x).sum().backward()
        assert x.grad.tolist() == [2.0, 2.0, 2.0]
        """,
    ),
    "autograd.forward_ad.dual_level": (
        "fwAD.enter_dual_level()",
        """
        assert fwAD._current_level == -1
        with fwAD.dual_level():
            dual = fwAD.make_dual(torch.ones(2), torch.ones(2))
            assert fwAD.unpack_dual(dual * 3).tangent.tolist() == [3.0, 3.0]
        """,
    ),
    "autograd.saved_tensors_hooks": (
        """
        ctx = torch.autograd.graph.saved_tensors_hooks(lambda t: t * 0, lambda t: t)
        ctx.__enter__()  # never exited: every saved tensor becomes zeros
        KEEP.append(ctx)
        """,
        """
        x = torch.ones(2, requires_grad=True)
        (x * x).sum().backward()
        assert x.grad.tolist() == [2.0, 2.0]
        """,
    ),
    "nn.module_forward_hooks": (
        "torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: o * 0)",
        "assert not torch.nn.modules.module._global_forward_hooks",
    ),
    "nn.module_forward_pre_hooks": (
        "torch.nn.modules.module.register_module_forward_pre_hook(lambda m, i: None)",
        "assert not torch.nn.modules.module._global_forward_pre_hooks",
    ),
    "profiler.enabled": (
        """
        prof = torch.autograd.profiler.profile()
        prof.__enter__()  # never exited
        KEEP.append(prof)
        """,
        f"assert not {C}._autograd._profiler_enabled()",
    ),
    "modes.dispatch_stack": (
        """
        mode = PassThrough()
        mode.__enter__()  # never exited
        KEEP.append(mode)
        """,
        f"assert {C}._len_torch_dispatch_stack() == 0",
    ),
    "modes.torch_function_stack": (
        """
        mode = TorchFunctionMode()
        mode.__enter__()  # never exited
        KEEP.append(mode)
        """,
        f"assert {C}._len_torch_function_stack() == 0",
    ),
    "modes.torch_function_state": (
        f"""
        ctx = {C}.DisableTorchFunctionSubclass()
        ctx.__enter__()  # never exited
        KEEP.append(ctx)
        """,
        f"assert {C}._is_torch_function_enabled()",
    ),
    "checkpoint.early_stop": (
        """
        ctx = torch.utils.checkpoint.set_checkpoint_early_stop(False)
        ctx.__enter__()  # never exited
        KEEP.append(ctx)
        """,
        "assert torch.utils.checkpoint._enable_checkpoint_early_stop is None",
    ),
    "checkpoint.debug": (
        """
        ctx = torch.utils.checkpoint.set_checkpoint_debug_enabled(True)
        ctx.__enter__()  # never exited
        KEEP.append(ctx)
        """,
        "assert torch.utils.checkpoint._checkpoint_debug_enabled is None",
    ),
    "inductor.deterministic": (
        """
        import torch._inductor.config as inductor_config
        inductor_config.deterministic = True
        """,
        """
        import torch._inductor.config as inductor_config
        assert inductor_config.deterministic is False
        """,
    ),
    "inductor.fallback_random": (
        "torch._inductor.config.fallback_random = True",
        "assert torch._inductor.config.fallback_random is False",
    ),
}


def _ident(name: str) -> str:
    return name.replace(".", "_")


def _module() -> str:
    parts = [_HEADER]
    for name, (change, check) in PAIRS.items():
        skip = (
            f"    if {name!r} in registry().absent:\n"
            f"        pytest.skip({name!r} + ': ' + registry().absent[{name!r}])\n"
        )
        for prefix, body in (("set", change), ("default_after", check)):
            parts.append(
                f"def test_{prefix}_{_ident(name)}():\n{skip}"
                + textwrap.indent(textwrap.dedent(body).strip(), "    ")
                + "\n\n"
            )
    return "\n".join(parts)


def test_each_setting_is_reported_by_name_and_restored(pytester: pytest.Pytester) -> None:
    assert len(PAIRS) >= 41
    pytester.makepyfile(test_adversary=_module())
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--backends-leaks=warn", "-rs"
    )
    out = result.stdout.str()
    absent = [name for name in PAIRS if name in registry().absent]
    present = [name for name in PAIRS if name not in absent]
    missing = [
        name
        for name in present
        if f"test_adversary.py::test_set_{_ident(name)} left torch backend flags changed" not in out
        or f"  {name}: " not in out
    ]
    assert not missing, f"changes not reported by name: {missing}\n{out}"
    result.assert_outcomes(passed=2 * len(present), skipped=2 * len(absent))
    # one leak report per changing test, none for the tests that check the default
    assert out.count("BackendsLeakWarning: test_adversary.py::test_set_") == len(present)
    assert "BackendsLeakWarning: test_adversary.py::test_default_after" not in out
    assert "could not restore" not in out


def test_every_setting_is_a_row_or_absent_with_a_reason() -> None:
    reg = registry()
    for name in PAIRS:
        assert (name in reg.by_name) != (name in reg.absent), name
    assert torch.__version__
