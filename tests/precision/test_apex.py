"""APEX AMP: registration of the recurrence entry points, O1/O2 regime resolution, and the
seed failure (fp16 U next to fp32 x and fp32 weights) as a regression test.

Real APEX cannot be installed here (it needs a CUDA build). The tests install
``standin_apex``: a STAND-IN module named ``apex`` that reproduces the parts of
``apex.amp`` sru_lightning relies on -- see :func:`make_standin_apex`.
"""

import sys
import types
import warnings

import lightning.pytorch as pl
import pytest
import torch
from helpers.tiny_trainer import tiny_trainer
from torch import nn

from sru_lightning.callbacks import SRUPrecisionCallback
from sru_lightning.nn import SRU, SRUCell
from sru_lightning.ops import functional, trace_storage_dtypes
from sru_lightning.precision import apex as sru_apex
from sru_lightning.precision import detect_regime


def make_standin_apex():
    """Build a STAND-IN for NVIDIA APEX (tests only; it is not APEX).

    What it reproduces from ``apex.amp``:
    * ``register_half_function`` / ``register_float_function(module, name)``: ValueError when
      ``module`` has no ``name``; the registration is queued, applied by ``initialize`` and
      then cleared (so registering after ``initialize`` has no effect, as in APEX);
    * ``initialize(models, optimizers, enabled=True, opt_level="O1")``: records the options in
      ``amp._amp_state.opt_properties`` (``enabled``, ``opt_level``, ``cast_model_type``);
      O1 replaces each registered function with a wrapper that casts its floating tensor
      arguments to half / float (APEX does that for CUDA tensors; the stand-in on any
      device); O2/O3 cast the models to half.
    """
    apex = types.ModuleType("apex")
    apex.__doc__ = "STAND-IN for NVIDIA APEX, installed by sru_lightning's tests"
    amp = types.ModuleType("apex.amp")
    amp.__doc__ = "STAND-IN for apex.amp"
    amp.queued = []  # (module, name, dtype)
    amp.applied = []
    amp._amp_state = types.SimpleNamespace()

    def _register(dtype):
        def register(module, name):
            if not hasattr(module, name):
                raise ValueError(f"No function named {name} in module {module}.")
            amp.queued.append((module, name, dtype))

        return register

    def _casting(fn, dtype):
        def cast(value):
            return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

        def wrapper(*args, **kwargs):
            return fn(*(cast(a) for a in args), **{k: cast(v) for k, v in kwargs.items()})

        return wrapper

    def initialize(models, optimizers=None, enabled=True, opt_level="O1"):
        cast_model_type = {"O0": torch.float32, "O1": None}.get(opt_level, torch.float16)
        amp._amp_state.opt_properties = types.SimpleNamespace(
            enabled=enabled,
            opt_level=opt_level,
            cast_model_type=cast_model_type,
            patch_torch_functions=opt_level == "O1",
        )
        if enabled and opt_level == "O1":
            for module, name, dtype in amp.queued:
                setattr(module, name, _casting(getattr(module, name), dtype))
                amp.applied.append((module, name, dtype))
        if enabled and opt_level in ("O2", "O3"):
            models.half()
        amp.queued.clear()
        return models if optimizers is None else (models, optimizers)

    amp.register_half_function = _register(torch.float16)
    amp.register_float_function = _register(torch.float32)
    amp.initialize = initialize
    apex.amp = amp
    return apex


@pytest.fixture
def standin_apex(monkeypatch):
    apex = make_standin_apex()
    monkeypatch.setitem(sys.modules, "apex", apex)
    monkeypatch.setitem(sys.modules, "apex.amp", apex.amp)
    # The stand-in's O1 replaces these module attributes; monkeypatch puts them back.
    for name in sru_apex.ENTRY_POINTS:
        monkeypatch.setattr(functional, name, getattr(functional, name))
    return apex


def cpu_trainer(precision="32-true", **kwargs):
    return tiny_trainer(precision=precision, **kwargs)


def recurrence_inputs(u_dtype=torch.float16, other_dtype=torch.float32, length=5, batch=3, hidden=4):
    return dict(
        U=torch.randn(length, batch, 3 * hidden).to(u_dtype).requires_grad_(),
        x=torch.randn(length, batch, hidden, dtype=other_dtype, requires_grad=True),
        weight_c=torch.randn(2 * hidden, dtype=other_dtype, requires_grad=True),
        bias=torch.zeros(2 * hidden, dtype=other_dtype, requires_grad=True),
        c0=torch.randn(batch, hidden, dtype=other_dtype, requires_grad=True),
    )


# ---------------------------------------------------------------- seed failure regression


@pytest.mark.parametrize("policy, storage", [("auto", torch.float16), ("half", torch.float16), ("fp32", torch.float32)])
def test_fp16_U_with_fp32_x_and_weights_reaching_the_op_does_not_raise(policy, storage):
    # The classic "expected scalar type Half but found Float": APEX O1 / autocast make the
    # matmul emit fp16 while the skip input and the recurrence weights stay fp32.
    t = recurrence_inputs()
    with trace_storage_dtypes() as calls:
        h, c = functional.sru_recurrence(t["U"], t["x"], t["weight_c"], t["bias"], t["c0"], policy=policy)
        h.float().square().sum().backward()
        h_inf, _ = functional.sru_recurrence_inference(
            t["U"].detach(), t["x"].detach(), t["weight_c"].detach(), t["bias"].detach(), policy=policy
        )
    assert h.dtype == c.dtype == h_inf.dtype == torch.float16  # results come back in U's dtype
    assert {call.storage_dtype for call in calls} == {storage}
    assert {call.direction for call in calls} == {"forward", "backward", "inference"}
    for name, tensor in t.items():  # each gradient arrives in its own input's dtype
        assert tensor.grad is not None and tensor.grad.dtype == tensor.dtype, name
        assert torch.isfinite(tensor.grad.float()).all(), name


def test_layer_with_fp16_matmul_output_and_fp32_residual_does_not_raise():
    # Through a layer: custom_m emits fp16 U (as APEX O1's patched matmul does) while the
    # layer's input (the k = 3 skip term), weight_c and bias stay fp32.
    class HalfMatmul(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 24, bias=False)

        def reset_parameters(self):
            self.linear.reset_parameters()

        def forward(self, x):
            return self.linear(x).half()

    cell = SRUCell(8, 8, custom_m=HalfMatmul())
    x = torch.randn(6, 2, 8, requires_grad=True)
    h, c = cell(x)
    h.float().sum().backward()
    assert h.dtype == torch.float16 and x.grad.dtype == torch.float32
    assert cell.bias.grad.dtype == torch.float32


# ---------------------------------------------------------------- registration


def test_without_apex_nothing_is_registered(monkeypatch):
    monkeypatch.setitem(sys.modules, "apex", None)  # makes `import apex` raise ImportError
    monkeypatch.delitem(sys.modules, "apex.amp", raising=False)
    assert sru_apex.apex_amp() is None
    assert sru_apex.register_with_apex("auto") == []
    assert sru_apex.initialized_apex_properties() is None


@pytest.mark.parametrize("policy, dtype", [("auto", torch.float16), ("half", torch.float16), ("fp32", torch.float32)])
def test_policy_picks_half_or_float_registration(standin_apex, policy, dtype):
    done = sru_apex.register_with_apex(policy)
    kind = "float" if dtype == torch.float32 else "half"
    assert done == [("sru_recurrence", kind), ("sru_recurrence_inference", kind)]
    assert standin_apex.amp.queued == [
        (functional, "sru_recurrence", dtype),
        (functional, "sru_recurrence_inference", dtype),
    ]


def test_bad_policy_is_rejected_before_anything_is_registered(standin_apex):
    with pytest.raises(ValueError, match=r"`policy` must be one of .* got 'fp16'"):
        sru_apex.register_with_apex("fp16")
    assert standin_apex.amp.queued == []


@pytest.mark.parametrize("policy, storage", [("auto", torch.float16), ("fp32", torch.float32)])
def test_o1_casts_every_recurrence_input_the_way_the_policy_says(standin_apex, policy, storage):
    sru_apex.register_with_apex(policy)
    layer = SRU(8, 8, num_layers=1, recurrence_policy=policy)
    original = functional.sru_recurrence
    standin_apex.amp.initialize(layer, opt_level="O1")
    assert functional.sru_recurrence is not original  # APEX's wrapper took its place
    x = torch.randn(5, 2, 8)
    with trace_storage_dtypes() as calls:
        h, _ = layer(x)  # the layer looks the entry point up at call time: APEX's wrapper runs
        with torch.no_grad():
            layer(x)
    assert {call.storage_dtype for call in calls} == {storage}
    assert {call.direction for call in calls} == {"forward", "inference"}
    assert h.dtype == storage


def test_registering_after_initialize_warns_that_it_is_too_late(standin_apex):
    standin_apex.amp.initialize(nn.Linear(2, 2), opt_level="O1")
    with pytest.warns(RuntimeWarning, match="before amp.initialize"):
        sru_apex.register_with_apex("auto")


def test_changing_the_registration_kind_warns(standin_apex):
    sru_apex.register_with_apex("auto")
    with pytest.warns(RuntimeWarning, match="registered with APEX as a half function"):
        sru_apex.register_with_apex("fp32")


# ---------------------------------------------------------------- regimes


@pytest.mark.parametrize(
    "opt_level, weights, u_dtype",
    [("O1", torch.float32, torch.float16), ("O2", torch.float16, torch.float16), ("O0", torch.float32, torch.float32)],
)
def test_user_initialised_apex_resolves_on_a_32_true_trainer(standin_apex, opt_level, weights, u_dtype):
    trainer = cpu_trainer("32-true")
    assert detect_regime(trainer).name == "32-true"
    standin_apex.amp.initialize(nn.Linear(2, 2), opt_level=opt_level)
    regime = detect_regime(trainer)
    assert (regime.name, regime.apex_opt_level) == (f"apex-{opt_level}", opt_level)
    assert (regime.param_dtype, regime.u_dtype, regime.device_type) == (weights, u_dtype, "cpu")
    assert regime.storage_dtype("auto") == u_dtype
    assert regime.storage_dtype("fp32") == torch.float32
    assert regime.accumulation_dtype("auto") == torch.float32


def test_disabled_apex_does_not_count(standin_apex):
    standin_apex.amp.initialize(nn.Linear(2, 2), enabled=False, opt_level="O1")
    assert detect_regime(cpu_trainer("32-true")).name == "32-true"


def test_apex_on_top_of_lightning_amp_is_flagged(standin_apex):
    standin_apex.amp.initialize(nn.Linear(2, 2), opt_level="O1")
    regime = detect_regime(cpu_trainer("bf16-mixed"))
    assert regime.name == "bf16-mixed"
    assert any("APEX AMP O1 is initialised on top of" in note for note in regime.notes)


# ---------------------------------------------------------------- callback + APEX in a fit


class ApexO1Model(pl.LightningModule):
    """Calls amp.initialize in configure_optimizers, after the callback's setup hook."""

    def __init__(self):
        super().__init__()
        self.rnn = SRU(8, 8, num_layers=1)
        self.head = nn.Linear(8, 4)
        self.seen_dtypes = set()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        _, optimizer = sys.modules["apex"].amp.initialize(self, optimizer, opt_level="O1")
        return optimizer

    def training_step(self, batch, batch_idx):
        (x,) = batch
        h, _ = self.rnn(x.transpose(0, 1))
        self.seen_dtypes.add(h.dtype)
        return self.head(h.float()).square().mean()


def test_callback_registers_before_apex_initialize_in_a_fit(standin_apex):
    callback = SRUPrecisionCallback("auto")
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 6, 8)), batch_size=2)
    model = ApexO1Model()
    with trace_storage_dtypes() as calls, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "registered too late" warning
        cpu_trainer(max_steps=2, callbacks=[callback]).fit(model, data)
    assert callback.apex_registrations == [("sru_recurrence", "half"), ("sru_recurrence_inference", "half")]
    assert [(name, dtype) for _, name, dtype in standin_apex.amp.applied] == [
        ("sru_recurrence", torch.float16),
        ("sru_recurrence_inference", torch.float16),
    ]
    assert callback.regime.name == "apex-O1"  # detected at fit start, after configure_optimizers
    assert "apex.amp" in callback.report
    assert {call.storage_dtype for call in calls} == {torch.float16}
    assert model.seen_dtypes == {torch.float16}


def test_callback_can_leave_apex_alone(standin_apex):
    callback = SRUPrecisionCallback("auto", register_apex=False)
    callback.setup(cpu_trainer(), nn.Sequential(SRU(4, 4, num_layers=1)), "fit")
    assert callback.apex_registrations == [] and standin_apex.amp.queued == []
