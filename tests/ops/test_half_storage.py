"""Half storage (bf16, fp16) in the CPU kernels at every vector level this CPU has.

Each level runs in its own process, capped by SRU_LIGHTNING_CPU_VECTORS. Hidden sizes 70 and
40 give a full block of 64 columns, a partial one, and partial vector blocks of the widening
and narrowing code (70 = 4 x 16 + 6, 40 = 2 x 16 + 8). Per storage dtype and variant:

* forward h and c_last, and the gradients of one step, equal the float32 kernel on the same
  (widened) inputs, rounded once to the storage dtype, nearly everywhere: the half path runs
  the float32 step loops and only narrows on store, but with a gate exponential accurate to
  3e-6 instead of 6e-9. So a few values round to the neighbouring half value, and none differs
  by more than one unit in the last place of max(|value|, 1) (h = skip + (c - skip) * r can cancel to a small value);
* outputs and gradients stay within the documented bounds (test_ops_cpp.STORAGE_BOUNDS) of a
  float64 reference on the same rounded inputs;
* NaN and Inf reach exactly the outputs they reach in float32 storage.
"""

from __future__ import annotations

import os
import sys

import pytest
from helpers import preloaded

CHECK = r"""
import torch
from sru_lightning import ops
from sru_lightning.ops import op
from sru_lightning.ops.signature import RecurrenceCall
from sru_lightning.ops.testing import make_case, relative_error, run_with_grads

VARIANTS = [
    dict(),
    dict(bidirectional=True, with_mask_c=True, with_mask_pad=True),
    dict(k=4),
    dict(bidirectional=True, k=4, per_step_weight_c=True),
    dict(has_skip_term=False, per_step_weight_c=True, with_mask_pad=True),
    dict(with_c0=False, with_mask_c=True, per_step_weight_c=True),
]
BOUNDS = {torch.float16: (2e-3, 1e-2), torch.bfloat16: (1.6e-2, 8e-2)}


def kernel(U, x, weight_c, bias, c0, *, scale_x=None, mask_c=None, mask_pad=None, reset=None, bidirectional=False,
           has_skip_term=True):
    return op.sru_forward(RecurrenceCall(U=U, x=x, weight_c=weight_c, bias=bias, c0=c0, scale_x=scale_x,
                                         mask_c=mask_c, mask_pad=mask_pad, reset=reset, bidirectional=bidirectional,
                                         has_skip_term=has_skip_term))


def cast(tensors, kwargs, dtype):
    tensors = [None if t is None else t.to(dtype) for t in tensors]
    kwargs = {k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in kwargs.items()}
    return tensors, kwargs


def within_one_unit(value, value32):
    # |value - value32| <= one unit in the storage's last place of max(|value32|, 1).
    unit = value32.abs().clamp_min(1.0) * torch.finfo(value.dtype).eps
    return bool(((value.float() - value32).abs() <= unit).all())


def grads_of_one_step(tensors, kwargs, storage):
    # The gradients for weights of h and c_last drawn in `storage`, the same values in either run.
    leaves = [None if t is None else t.detach().clone().requires_grad_(True) for t in tensors]
    h, c_last = kernel(*leaves, **kwargs)
    generator = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=generator).to(storage).to(t.dtype) for t in (h, c_last)]
    wanted = [t for t in leaves if t is not None]
    found = iter(torch.autograd.grad((h, c_last), wanted, weights, allow_unused=True))
    return [None if t is None else next(found) for t in leaves]


checked = 0
for storage, (output_bound, grad_bound) in BOUNDS.items():
    for hidden in (70, 40):
        for variant in VARIANTS:
            case = make_case(length=6, batch=3, hidden=hidden, **variant)
            tensors, kwargs = cast(*case, storage)
            widened, widened_kwargs = cast(tensors, kwargs, torch.float32)
            h, c_last, grads = run_with_grads(kernel, tensors, kwargs)
            with torch.no_grad():
                h32, c32 = kernel(*widened, **widened_kwargs)
            where = (storage, hidden, variant)
            assert h.dtype == c_last.dtype == storage, where
            for value, value32 in ((h, h32), (c_last, c32)):
                assert within_one_unit(value, value32), where
                assert (value == value32.to(storage)).float().mean() > 0.95, where
            # One step: c_prev is c0, the same values in both storages, so the gradients too
            # are the float32 kernel's rounded once to the storage (bfloat16 U and grad_U take
            # another layout than float16's at the AVX-512 levels: this checks its rounding).
            step_tensors = [None if t is None else t[:1] if t.dim() == 3 else t for t in tensors]  # (L, B, ...)
            step_kwargs = {k: (v[:1] if k == "mask_pad" and v is not None else v) for k, v in kwargs.items()}
            step_grads = grads_of_one_step(step_tensors, step_kwargs, storage)
            step_grads32 = grads_of_one_step(*cast(step_tensors, step_kwargs, torch.float32), storage)
            for grad, grad32 in zip(step_grads, step_grads32):
                if grad is not None:
                    assert within_one_unit(grad, grad32), where
                    assert (grad == grad32.to(storage)).float().mean() > 0.95, where
            rounded, rounded_kwargs = cast(tensors, kwargs, torch.float64)
            h_ref, c_ref, grads_ref = run_with_grads(ops.sru_recurrence_reference, rounded, rounded_kwargs)
            assert relative_error(h, h_ref, floor=1.0) < output_bound, where
            assert relative_error(c_last, c_ref, floor=1.0) < output_bound, where
            for name, grad, grad_ref in zip(("U", "x", "weight_c", "bias", "c0"), grads, grads_ref):
                if grad is None or grad_ref is None:
                    continue
                assert grad.dtype == storage, (where, name)
                assert relative_error(grad, grad_ref, floor=1.0) < grad_bound, (where, name)
            checked += 1

    # NaN and Inf in the vector part (column 17) and the tail (column 66) of U's candidate,
    # and in a gate logit: the same outputs are non-finite as in float32 storage.
    for bad in (float("nan"), float("inf"), float("-inf")):
        (U, x, weight_c, bias, c0), kwargs = make_case(length=5, batch=3, hidden=70, with_mask_pad=True)
        U = U.clone()
        U[1, 0, 3 * 17] = bad
        U[2, 1, 3 * 66] = bad
        U[3, 2, 3 * 5 + 1] = bad
        tensors, kwargs = cast((U, x, weight_c, bias, c0), kwargs, storage)
        widened, widened_kwargs = cast(tensors, kwargs, torch.float32)
        h, c_last, grads = run_with_grads(kernel, tensors, kwargs)
        h32, c32, grads32 = run_with_grads(kernel, widened, widened_kwargs)
        assert torch.equal(torch.isfinite(h), torch.isfinite(h32)), (storage, bad)
        assert torch.equal(torch.isnan(h), torch.isnan(h32)), (storage, bad)
        assert torch.equal(torch.isfinite(c_last), torch.isfinite(c32)), (storage, bad)
        assert not torch.isfinite(h).all() and torch.isfinite(h[:, :, :5]).all(), (storage, bad)
        for grad, grad32 in zip(grads, grads32):
            if grad is not None:
                assert torch.equal(torch.isfinite(grad), torch.isfinite(grad32)), (storage, bad)
print(checked, op.cpu_vector_level(), "ok")
"""

LEVELS = ("baseline", "avx2", "avx512", "avx512_bf16")


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize(
    "level",
    # a capped level runs a library of that level: built here unless the cache has one of every level
    [*(pytest.param(level, marks=pytest.mark.toolchain) for level in LEVELS[:-1]), LEVELS[-1]],
)
def test_half_storage_kernels_at_every_vector_level(level):
    env = dict(os.environ)
    env.pop("SRU_LIGHTNING_CPU_VECTORS", None)
    if level != "avx512_bf16":  # the widest level: no cap
        env["SRU_LIGHTNING_CPU_VECTORS"] = level
    result = preloaded.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
    checked, ran = result.stdout.split()[-3:-1]
    assert int(checked) == 2 * 2 * 6
    if ran != level:
        assert LEVELS.index(ran) < LEVELS.index(level), (ran, level)
        pytest.skip(f"this processor has no {level} vector code (its widest is {ran})")
