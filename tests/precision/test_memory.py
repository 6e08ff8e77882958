"""AMP must save memory, not cost it: under a half policy autograd saves <= 0.55x the bytes of
the float32 run for an SRU stack (measured with saved-tensor hooks)."""

import pytest
import torch

from sru_lightning.diagnostics.op_bench import saved_tensor_bytes
from sru_lightning.nn import SRU, set_recurrence_policy

LENGTH, BATCH, HIDDEN = 32, 8, 64


def saved_bytes(stack, x, autocast_dtype=None):
    def run():
        if autocast_dtype is None:
            return stack(x)
        with torch.autocast("cpu", dtype=autocast_dtype):
            return stack(x)

    return saved_tensor_bytes(run)


@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("autocast_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("policy", ["half", "auto"])
def test_half_policy_under_autocast_saves_at_most_055x(num_layers, autocast_dtype, policy):
    stack = SRU(HIDDEN, HIDDEN, num_layers=num_layers)
    x = torch.randn(LENGTH, BATCH, HIDDEN, requires_grad=True)
    fp32 = saved_bytes(stack, x)
    set_recurrence_policy(stack, policy)
    half = saved_bytes(stack, x, autocast_dtype)
    assert half <= 0.55 * fp32, f"half policy saved {half} bytes, float32 {fp32}: ratio {half / fp32:.3f}"


def test_fp32_policy_under_autocast_keeps_float32_storage_and_saves_more():
    # The contrast that makes the test above meaningful: fp32 storage under autocast
    # saves the half matmul operands plus float32 recurrence tensors.
    stack = SRU(HIDDEN, HIDDEN, num_layers=2)
    x = torch.randn(LENGTH, BATCH, HIDDEN, requires_grad=True)
    fp32 = saved_bytes(stack, x)
    set_recurrence_policy(stack, "fp32")
    assert saved_bytes(stack, x, torch.bfloat16) > 0.75 * fp32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_weights_save_half_the_bytes(dtype):
    stack = SRU(HIDDEN, HIDDEN, num_layers=2)
    x = torch.randn(LENGTH, BATCH, HIDDEN, requires_grad=True)
    fp32 = saved_bytes(stack, x)
    half = saved_bytes(stack.to(dtype), x.detach().to(dtype).requires_grad_())
    assert half <= 0.55 * fp32
