"""Every CPU vector level the kernels are compiled for (baseline x86-64, AVX2+FMA+F16C,
AVX-512, AVX-512 with BF16 conversions) computes the same recurrence: each level runs in its own process, capped by
SRU_LIGHTNING_CPU_VECTORS, and is compared with the reference."""

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
from sru_lightning.ops.testing import make_case, run_with_grads
worst = 0.0
for dtype, bound in ((torch.float64, 1e-10), (torch.float32, 1e-5), (torch.bfloat16, 1e-1), (torch.float16, 2e-2)):
    for variant in (dict(bidirectional=True, with_mask_pad=True, with_mask_c=True), dict(k=4, per_step_weight_c=True)):
        tensors, kwargs = make_case(length=5, batch=3, hidden=70, dtype=dtype, **variant)
        kwargs["reset"] = torch.tensor([[0, 1, 0], [0, 0, 0], [1, 0, 0], [0, 1, 1], [0, 0, 0]], dtype=torch.bool)
        fn = lambda U, x, w, b, c0, **kw: op.sru_forward(RecurrenceCall(U=U, x=x, weight_c=w, bias=b, c0=c0, **kw))
        got = run_with_grads(fn, tensors, kwargs)
        doubled = {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in kwargs.items()}
        ref = run_with_grads(ops.sru_recurrence_reference, [t.double() if t is not None else None for t in tensors],
                             doubled)
        pairs = [(got[0], ref[0]), (got[1], ref[1])] + [(g, r) for g, r in zip(got[2], ref[2]) if r is not None]
        for g, r in pairs:
            error = ((g.double() - r).abs().max() / r.abs().max().clamp_min(1)).item()
            assert error < bound, (dtype, variant, error)
print(op.cpu_vector_level(), "ok")
"""


LEVELS = ("baseline", "avx2", "avx512", "avx512_bf16")


# A capped level runs a library of that level: built here unless the cache has one of every
# level (make test builds it first).
CAPPED = [pytest.param(level, marks=pytest.mark.toolchain) for level in ("baseline", "avx2", "avx512")]


@pytest.mark.slow  # starts a process
@pytest.mark.parametrize("level", [*CAPPED, "best"])
def test_every_vector_level_matches_the_reference(level):
    env = dict(os.environ)
    env.pop("SRU_LIGHTNING_CPU_VECTORS", None)
    if level != "best":
        env["SRU_LIGHTNING_CPU_VECTORS"] = level
    result = preloaded.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
    ran = result.stdout.split()[-2]
    if level == "best":
        assert ran in LEVELS
    elif LEVELS.index(ran) < LEVELS.index(level):
        pytest.skip(f"this processor has no {level} vector code (its widest is {ran})")
    else:
        assert ran == level
