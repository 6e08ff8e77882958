"""SRU layers on a CUDA GPU: same results as on CPU in fp32, close under autocast."""

from __future__ import annotations

import copy

import pytest
import torch

from sru_lightning.nn import SRU
from sru_lightning.ops import trace_storage_dtypes

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: torch.cuda.is_available() is False"),
]


def _model_and_inputs():
    torch.manual_seed(0)
    model = SRU(8, 8, num_layers=2, bidirectional=True, layer_norm=True, projection_size=4, highway_bias=-1.0)
    x = torch.randn(7, 3, 8)
    c0 = torch.randn(2, 3, 16)
    mask_pad = torch.zeros(7, 3, dtype=torch.bool)
    mask_pad[5:, 1] = True
    return model, x, c0, mask_pad


def test_cuda_fp32_matches_cpu():
    model, x, c0, mask_pad = _model_and_inputs()
    gpu = copy.deepcopy(model).cuda()
    h, c = model(x, c0, mask_pad=mask_pad)
    h_gpu, c_gpu = gpu(x.cuda(), c0.cuda(), mask_pad=mask_pad.cuda())
    torch.testing.assert_close(h_gpu.cpu(), h, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c_gpu.cpu(), c, rtol=1e-5, atol=1e-5)
    h.sum().backward()
    h_gpu.sum().backward()
    for (name, p), p_gpu in zip(model.named_parameters(), gpu.parameters()):
        torch.testing.assert_close(p_gpu.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_cuda_autocast_close_to_fp32(half):
    model, x, c0, mask_pad = _model_and_inputs()
    gpu = copy.deepcopy(model).cuda()
    h, _ = model(x, c0, mask_pad=mask_pad)
    with trace_storage_dtypes() as calls, torch.autocast("cuda", dtype=half):
        h_gpu, _ = gpu(x.cuda(), c0.cuda(), mask_pad=mask_pad.cuda())
    assert h_gpu.dtype == half
    assert {call.storage_dtype for call in calls} == {half}
    torch.testing.assert_close(h_gpu.float().cpu(), h, rtol=5e-2, atol=5e-2)
    h_gpu.float().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in gpu.parameters())
