"""The C++ recurrence op: gradients (gradcheck in float64), agreement with the reference on
random configurations, every storage dtype, inference without stored states."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from helpers import preloaded
from hypothesis import given, settings
from hypothesis import strategies as st

from sru_lightning import ops
from sru_lightning.ops import op
from sru_lightning.ops.signature import RecurrenceCall
from sru_lightning.ops.testing import make_case, relative_error, run_with_grads

VARIANTS = {
    "uni-k3-skip": dict(),
    "bi-k3-skip-masks": dict(bidirectional=True, with_mask_c=True, with_mask_pad=True),
    "uni-k4-skip": dict(k=4),
    "bi-k4-skip-per-step-v": dict(bidirectional=True, k=4, per_step_weight_c=True),
    "uni-k3-no-skip-per-step-v-pad": dict(has_skip_term=False, per_step_weight_c=True, with_mask_pad=True),
    "bi-k4-no-skip-mask-c": dict(bidirectional=True, k=4, has_skip_term=False, with_mask_c=True),
    "uni-no-c0-all-masks-per-step-v": dict(with_c0=False, with_mask_c=True, with_mask_pad=True, per_step_weight_c=True),
    "bi-k3-no-scale": dict(bidirectional=True, scale_x=None),
}


def cpp_forward(
    U,
    x,
    weight_c,
    bias,
    c0,
    *,
    scale_x=None,
    mask_c=None,
    mask_pad=None,
    reset=None,
    bidirectional=False,
    has_skip_term=True,
):
    call = RecurrenceCall(
        U=U,
        x=x,
        weight_c=weight_c,
        bias=bias,
        c0=c0,
        scale_x=scale_x,
        mask_c=mask_c,
        mask_pad=mask_pad,
        reset=reset,
        bidirectional=bidirectional,
        has_skip_term=has_skip_term,
    )
    return op.sru_forward(call)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_gradcheck_float64(variant):
    (U, x, weight_c, bias, c0), kwargs = make_case(length=4, batch=2, hidden=3, **VARIANTS[variant])
    leaves = [t.requires_grad_(True) for t in (U, x, weight_c, bias, c0) if t is not None]
    has_c0 = c0 is not None

    def fn(*tensors):
        U_, x_, w_, b_ = tensors[:4]
        c0_ = tensors[4] if has_c0 else None
        return cpp_forward(U_, x_, w_, b_, c0_, **kwargs)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7)


def test_gradcheck_python_float_scale_and_single_step():
    (U, x, weight_c, bias, c0), kwargs = make_case(length=1, batch=2, hidden=3, scale_x=None)
    leaves = [t[0] if t.dim() == 3 else t for t in (U, x)] + [weight_c, bias, c0]
    leaves = [t.detach().requires_grad_(True) for t in leaves]

    def fn(U_, x_, w_, b_, c0_):
        return ops.sru_recurrence(U_, x_, w_, b_, c0_, scale_x=1.7, policy="fp32")

    h, _ = fn(*leaves)
    assert h.shape == (2, 3)
    assert torch.autograd.gradcheck(fn, leaves, eps=1e-6, atol=1e-7)


@settings(max_examples=20, deadline=None)
@given(
    length=st.integers(1, 6),
    batch=st.integers(1, 3),
    hidden=st.integers(1, 70),
    bidirectional=st.booleans(),
    k=st.sampled_from([3, 4]),
    has_skip_term=st.booleans(),
    per_step_weight_c=st.booleans(),
    with_c0=st.booleans(),
    with_mask_c=st.booleans(),
    with_mask_pad=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cpp_matches_reference_on_random_configurations(**config):
    tensors, kwargs = make_case(**config)
    h, c_last, grads = run_with_grads(cpp_forward, tensors, kwargs)
    h_ref, c_ref, grads_ref = run_with_grads(ops.sru_recurrence_reference, tensors, kwargs)
    torch.testing.assert_close(h, h_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(c_last, c_ref, rtol=1e-10, atol=1e-10)
    needs_x = config["has_skip_term"] and config["k"] == 3
    for name, grad, grad_ref in zip(("U", "x", "weight_c", "bias", "c0"), grads, grads_ref):
        if name == "x" and not needs_x:
            assert grad is None or torch.count_nonzero(grad) == 0
            continue
        if grad_ref is None:
            continue
        torch.testing.assert_close(grad, grad_ref, rtol=1e-9, atol=1e-9, msg=f"gradient of {name}")


# Bounds against a float64 reference on the same (rounded) inputs. The kernel accumulates in
# float32, so the error is the rounding of each stored value to the storage type: about one
# unit in the last place (fp16 2**-11, bf16 2**-8 relative) times the size of the values.
STORAGE_BOUNDS = {
    torch.float32: dict(output=1e-5, grad=1e-4),
    torch.float16: dict(output=2e-3, grad=1e-2),
    torch.bfloat16: dict(output=1.6e-2, grad=8e-2),
}


@pytest.mark.parametrize("storage", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", ["bi-k3-skip-masks", "uni-k4-skip", "bi-k4-skip-per-step-v"])
def test_low_precision_storage_against_float64(storage, variant):
    tensors64, kwargs64 = make_case(length=16, batch=4, hidden=24, **VARIANTS[variant])
    # The reference sees exactly the values the kernel sees: the inputs rounded to storage.
    rounded = [None if t is None else t.to(storage).to(torch.float64) for t in tensors64]
    kwargs_storage = {
        k: (v.to(storage) if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in kwargs64.items()
    }
    kwargs_rounded = {
        k: (v.to(torch.float64) if torch.is_tensor(v) and v.is_floating_point() else v)
        for k, v in kwargs_storage.items()
    }
    with ops.trace_storage_dtypes() as calls:
        h, c_last, grads = run_with_grads(
            cpp_forward, [None if t is None else t.to(storage) for t in tensors64], kwargs_storage
        )
    assert {call.storage_dtype for call in calls} == {storage}
    assert {call.accumulation_dtype for call in calls} == {torch.float32}
    h_ref, c_ref, grads_ref = run_with_grads(ops.sru_recurrence_reference, rounded, kwargs_rounded)
    bounds = STORAGE_BOUNDS[storage]

    assert h.dtype == storage and c_last.dtype == storage
    assert relative_error(h, h_ref, floor=1.0) < bounds["output"]
    assert relative_error(c_last, c_ref, floor=1.0) < bounds["output"]
    for name, grad, grad_ref in zip(("U", "x", "weight_c", "bias", "c0"), grads, grads_ref):
        if grad_ref is None or grad is None:
            continue
        assert grad.dtype == storage
        assert relative_error(grad, grad_ref, floor=1.0) < bounds["grad"], name


def test_inference_does_not_store_states_and_matches_training_forward():
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32, bidirectional=True, with_mask_pad=True)
    scale = kwargs["scale_x"]
    h_all, c_all_last, c_all = torch.ops.sru_lightning.recurrence_forward(
        U, x, weight_c, bias, c0, scale, 1.0, None, kwargs["mask_pad"], None, None, True, True, True
    )
    h_inf, c_inf_last, no_states = torch.ops.sru_lightning.recurrence_forward(
        U, x, weight_c, bias, c0, scale, 1.0, None, kwargs["mask_pad"], None, None, True, True, False
    )
    assert c_all.shape == h_all.shape and no_states.numel() == 0
    assert torch.equal(h_all, h_inf) and torch.equal(c_all_last, c_inf_last)
    with ops.trace_storage_dtypes() as calls:
        h, c = ops.sru_recurrence_inference(U.requires_grad_(), x, weight_c, bias, c0, **kwargs)
    assert not h.requires_grad
    assert [(call.backend, call.direction) for call in calls] == [("cpp", "inference")]
    assert torch.equal(h, h_inf)


def test_backward_without_stored_states_is_a_clear_error():
    (U, x, weight_c, bias, c0), kwargs = make_case(dtype=torch.float32)
    with pytest.raises(ValueError, match="c_all"):
        torch.ops.sru_lightning.recurrence_backward(
            torch.ones(5, 3, 4),
            None,
            None,
            U,
            x,
            weight_c,
            bias,
            c0,
            None,
            1.0,
            None,
            None,
            None,
            None,
            torch.empty(0),
            False,
            True,
        )


def test_cpp_op_rejects_mixed_dtypes_with_the_argument_name():
    (U, x, weight_c, bias, c0), _ = make_case(dtype=torch.float32)
    with pytest.raises(TypeError, match="`x` must have U's dtype"):
        torch.ops.sru_lightning.recurrence_forward(
            U, x.double(), weight_c, bias, c0, None, 1.0, None, None, None, None, False, True, True
        )


@pytest.mark.parametrize("length,batch", [(0, 3), (4, 0)])
def test_empty_sequence_or_batch(length, batch):
    tensors, kwargs = make_case(length=length, batch=batch, dtype=torch.float32)
    h, c_last, grads = run_with_grads(cpp_forward, tensors, kwargs)
    h_ref, c_ref, grads_ref = run_with_grads(ops.sru_recurrence_reference, tensors, kwargs)
    assert h.shape == h_ref.shape == (length, batch, 4)
    torch.testing.assert_close(c_last, c_ref)
    torch.testing.assert_close(grads[4], grads_ref[4])  # c0: the gradient passes straight through


def test_non_contiguous_inputs():
    (U, x, weight_c, bias, c0), kwargs = make_case(length=6, batch=3, dtype=torch.float32)
    U_t = U.transpose(0, 1).contiguous().transpose(0, 1)
    x_t = x.transpose(0, 1).contiguous().transpose(0, 1)
    assert not U_t.is_contiguous()
    h, c_last = cpp_forward(U_t, x_t, weight_c, bias, c0, **kwargs)
    h_ref, c_ref = cpp_forward(U, x, weight_c, bias, c0, **kwargs)
    assert torch.equal(h, h_ref) and torch.equal(c_last, c_ref)


@pytest.mark.parametrize("hidden", [5, 64], ids=["partial-block", "full-block"])
def test_saturated_gates_in_float32_match_float64(hidden):
    # Logits far beyond the +-40 clamp of the float32 gates: outputs and gradients still
    # agree with a float64 reference to float32 accuracy.
    tensors, kwargs = make_case(length=6, batch=2, hidden=hidden, dtype=torch.float64, seed=5)
    U = tensors[0] * 60.0
    tensors64 = (U,) + tuple(tensors[1:])
    tensors32 = tuple(None if t is None else t.float() for t in tensors64)
    kwargs32 = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in kwargs.items()}
    h, c_last, grads = run_with_grads(cpp_forward, tensors32, kwargs32)
    h_ref, c_ref, grads_ref = run_with_grads(ops.sru_recurrence_reference, tensors64, kwargs)
    scale = h_ref.abs().max().item()
    torch.testing.assert_close(h.double(), h_ref, rtol=1e-5, atol=1e-6 * scale)
    torch.testing.assert_close(c_last.double(), c_ref, rtol=1e-5, atol=1e-6 * scale)
    for grad, grad_ref in zip(grads, grads_ref):
        if grad_ref is not None:
            torch.testing.assert_close(grad.double(), grad_ref, rtol=1e-4, atol=1e-5 * grad_ref.abs().max().item())


def _large_case():
    # 2 MiB of h: above the 1 MiB size from which CPU outputs are recycled.
    return make_case(length=64, batch=32, hidden=256, dtype=torch.float32, with_c0=False)


def test_large_outputs_reuse_the_buffers_of_dead_outputs_with_identical_results():
    (U, x, weight_c, bias, c0), kwargs = _large_case()
    h1, c1 = cpp_forward(U, x, weight_c, bias, c0, **kwargs)
    expected_h, expected_c, first = h1.clone(), c1.clone(), h1.data_ptr()
    del h1, c1
    h2, c2 = cpp_forward(U, x, weight_c, bias, c0, **kwargs)
    # the dead h came back from the cache (the newest idle buffer of its size goes first),
    # and every value was rewritten
    assert h2.data_ptr() == first
    assert torch.equal(h2, expected_h) and torch.equal(c2, expected_c)
    # still an ordinary CPU tensor: it can grow in place
    h2.resize_(2 * h2.shape[0], *h2.shape[1:])
    assert torch.equal(h2[: expected_h.shape[0]], expected_h)
    del h2, c2
    assert op.release_cached_buffers() >= 3 * 64 * 32 * 256 * 4
    assert op.release_cached_buffers() == 0


@pytest.mark.slow  # starts processes or a compiler
def test_buffer_cache_size_comes_from_the_environment_and_bad_values_are_named():
    script = (
        "import torch; from sru_lightning.ops import op; from sru_lightning.ops.testing import make_case\n"
        "from sru_lightning.ops.signature import RecurrenceCall\n"
        "(U, x, w, b, c0), kw = make_case(length=64, batch=32, hidden=256, dtype=torch.float32)\n"
        "h, c = op.sru_forward(RecurrenceCall(U=U, x=x, weight_c=w, bias=b, c0=c0, scale_x=kw['scale_x']))\n"
        "del h, c\n"
        "print('freed', op.release_cached_buffers())\n"
    )
    off = preloaded.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SRU_LIGHTNING_CPU_BUFFER_CACHE_MB": "0"},
    )
    assert off.returncode == 0, off.stderr[-2000:]
    assert off.stdout.split()[-1] == "0"  # nothing was kept
    bad = preloaded.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SRU_LIGHTNING_CPU_BUFFER_CACHE_MB": "lots"},
    )
    assert bad.returncode != 0
    assert "SRU_LIGHTNING_CPU_BUFFER_CACHE_MB must be a whole number of MiB >= 0, got 'lots'" in bad.stderr
