"""Pieces shared by the SRU layers (:class:`SRUCell`, :class:`SRU`) and the SRU++ layers
(:class:`SRUppCell`, :class:`SRUpp`): the recurrence policy attribute, the recurrence call,
and the input handling common to both stacks.

Only logic that is the same for both families lives here; what follows one reference's
semantics (initialisation recipes, constructor arguments) stays in its own module.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

from sru_lightning.ops import functional
from sru_lightning.ops.storage_dtype import validate_policy

from .checks import check_floating_tensor, check_same_device, check_shape


def checked_policy(owner: str, policy) -> str:
    """Validate a recurrence policy, naming the layer that received it."""
    try:
        return validate_policy(policy, argument="recurrence_policy")
    except (TypeError, ValueError) as error:
        raise type(error)(f"{owner}: {error}") from None


def warn_rnn_dropout(owner: str) -> None:
    """The ``sru`` package deprecates ``rnn_dropout``; say so at the caller's constructor call."""
    warnings.warn(
        f"{owner}: `rnn_dropout` is deprecated (as in the sru package); use `dropout`",
        FutureWarning,
        stacklevel=3,
    )


def non_default_settings(
    module, defaults: Sequence[tuple[str, object]], attributes: dict[str, str] | None = None
) -> list[str]:
    """``name=value`` for each ``(name, default)`` whose value on ``module`` differs from the
    default, for ``extra_repr``; ``attributes`` maps a name to the attribute holding it."""
    attributes = attributes or {}
    parts = []
    for name, default in defaults:
        value = getattr(module, attributes.get(name, name))
        if value != default:
            parts.append(f"{name}={value!r}")
    return parts


def _float_or_as_given(value):
    """A real number as a float; None or anything else as given (the layer that uses it checks it)."""
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    return value


#: The options a layer keeps once checked, by argument name: the attribute that holds it and the
#: type it is kept in. A cell's `layer_norm` is its LayerNorm module, so the stacks keep the
#: flag as `use_layer_norm`.
_KEPT_SETTINGS = {
    "bidirectional": ("bidirectional", bool),
    "layer_norm": ("use_layer_norm", bool),
    "attn_layer_norm": ("attn_layer_norm", bool),
    "has_skip_term": ("has_skip_term", bool),
    "rescale": ("rescale", bool),
    "v1": ("v1", bool),
    "normalize_after": ("normalize_after", bool),
    "amp_recurrence_fp16": ("amp_recurrence_fp16", bool),
    "nn_rnn_compatible_return": ("nn_rnn_compatible_return", bool),
    "batch_first": ("batch_first", bool),
    "highway_bias": ("highway_bias", _float_or_as_given),
    "weight_c_init": ("weight_c_init", _float_or_as_given),
}


def store_settings(layer: nn.Module, **settings) -> None:
    """Keep a layer's options (checked already, or checked by the layers it builds) in the types
    it works with; `bidirectional` also sets ``num_directions`` and ``output_size`` (from the
    layer's ``hidden_size``). Passed by keyword, so a reordered call cannot swap two flags."""
    unknown = sorted(set(settings) - set(_KEPT_SETTINGS))
    if unknown:
        raise TypeError(f"store_settings: no rule to keep {unknown}; add them to _KEPT_SETTINGS")
    for name, value in settings.items():
        attribute, kept = _KEPT_SETTINGS[name]
        setattr(layer, attribute, kept(value))
    if "bidirectional" in settings:
        layer.num_directions = 2 if layer.bidirectional else 1
        layer.output_size = layer.hidden_size * layer.num_directions


def casts_own_inputs(layer: nn.Module) -> bool:
    """True when ``layer`` is sharded with FSDP2 (``fully_shard``): its pre-forward hook casts
    floating inputs to its mixed-precision parameter dtype and gathers the weights, so the
    dtype of its (still sharded) weights outside the call says nothing about its input."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return False
    return isinstance(layer, FSDPModule)


def wrapped_layer(layer: nn.Module) -> nn.Module:
    """`layer`, or the layer a wrapper in its place adapts.

    PEFT's LoRA on a parameter (``LoraConfig(target_parameters=[...])``, how an SRU layer's
    ``weight`` is adapted) puts a ``ParamWrapper`` in the layer's place: calls go through to the
    layer with the adapted weight, attributes (sizes, policy, ``custom_m``) do not, and it hands
    out the layer by ``get_base_layer()``. Looked up on the type: no ``__getattr__`` miss per call.
    """
    if getattr(type(layer), "get_base_layer", None) is None:
        return layer
    return layer.get_base_layer()


# ---------------------------------------------------------------------- TorchScript
def torchscript_unsupported(owner: str, how: str) -> RuntimeError:
    """The error of a TorchScript attempt (``how``: ``torch.jit.script``/``torch.jit.trace``).

    The layers' inputs and the recurrence op's arguments are handled in Python (optional
    tensors, unions, sequences, a float-or-None op argument) that TorchScript can neither
    compile nor record, and its own errors ("Unknown type annotation: 'Sequence'",
    "unsupported input list type: Scalar?") do not say that the layer as a whole is out of
    its reach, nor what to use instead.
    """
    return RuntimeError(
        f"{owner}: TorchScript ({how}) is not supported for sru_lightning layers (SRU, SRUCell, SRUpp); "
        "use torch.compile, torch.export.export, or `python -m sru_lightning export` "
        "(ONNX, torch.export, AOTInductor) for a trained language model"
    )


def refuse_jit_trace(owner: str) -> None:
    """Raise :func:`torchscript_unsupported` at the top of a forward run by ``torch.jit.trace``
    (also the legacy ``torch.onnx.export(..., dynamo=False)``), before any check records a
    shape as a constant."""
    if torch.jit.is_tracing():
        raise torchscript_unsupported(owner, "torch.jit.trace")


class RefusesTorchScript:
    """``torch.jit.script`` calls ``__prepare_scriptable__`` on a module and on each of its
    submodules before compiling anything, so a model that contains one of these layers is
    refused with the one clear message too."""

    def __prepare_scriptable__(self):
        raise torchscript_unsupported(type(self).__name__, "torch.jit.script")


# ---------------------------------------------------------------------- one layer
def zero_padded_steps(x: Tensor, mask_pad: Tensor | None) -> Tensor:
    """``x`` (S, B, ...) with the steps ``mask_pad`` (S, B) marks as padding set to zero.

    The recurrence never reads a padded step, but the products over all steps before it (the
    input projection, a layer norm, attention keys and values) and their weight gradients do:
    a NaN or Inf written there would reach the weights' gradients, or every output of the row
    through attention, as 0 x NaN = NaN. Filling (not multiplying) leaves such a value no way
    in, and makes every result equal to that of the zero-padded input. Free without padding.
    """
    if mask_pad is None:
        return x
    return x.masked_fill(mask_pad.to(torch.bool).unsqueeze(-1), 0.0)


def time_shared_dropout_mask(like: Tensor, size: tuple[int, int], p: float) -> Tensor:
    """Inverted-dropout mask shared over time (one Bernoulli draw per batch row and column)."""
    return like.new_empty(size).bernoulli_(1 - p).div_(1 - p)


class RecurrentCellMixin(RefusesTorchScript):
    """What :class:`SRUCell` and :class:`SRUppCell` share once U is computed: the recurrence
    policy, the recurrence's own parameters (``weight_c``, ``bias``, the ``scale_x`` buffer)
    with the optional ``layer_norm``, and the call of the recurrence op.

    Both set ``input_size``, ``output_size``, ``bidirectional``, ``normalize_after`` and
    ``rescale`` before using these pieces.
    """

    _recurrence_policy: str
    input_size: int
    output_size: int
    bidirectional: bool
    normalize_after: bool
    rescale: bool
    weight_c: nn.Parameter
    bias: nn.Parameter
    scale_x: Tensor
    layer_norm: nn.LayerNorm | None

    @property
    def recurrence_policy(self) -> str:
        return self._recurrence_policy

    @recurrence_policy.setter
    def recurrence_policy(self, policy: str) -> None:
        self._recurrence_policy = checked_policy(type(self).__name__, policy)

    def _add_recurrence_parameters(self, layer_norm: bool) -> None:
        """Register weight_c, bias, scale_x and layer_norm (names and order of the ``sru``
        package's cells); ``reset_parameters`` gives them their values."""
        self.weight_c = nn.Parameter(torch.empty(2 * self.output_size))
        self.bias = nn.Parameter(torch.empty(2 * self.output_size))
        # Multiplier of the skip input (k = 3); a buffer so checkpoints carry it.
        self.register_buffer("scale_x", torch.ones(1))
        if layer_norm:
            self.layer_norm = nn.LayerNorm(self.output_size if self.normalize_after else self.input_size)
        else:
            self.layer_norm = None

    def _normalized_input(self, x: Tensor) -> Tensor:
        """The layer norm on the input side (``normalize_after=False``), if any."""
        if self.layer_norm is not None and not self.normalize_after:
            return self.layer_norm(x)
        return x

    def _recurrence(
        self,
        U: Tensor,
        skip: Tensor | None,
        weight_c: Tensor,
        *,
        c0: Tensor | None,
        mask_c: Tensor | None,
        mask_pad: Tensor | None,
        has_skip_term: bool,
        reset: Tensor | None = None,
        c_starts: Tensor | None = None,
        return_states: bool = False,
    ) -> tuple[Tensor, ...]:
        """h and the last c from U through the package op, then the output-side layer norm
        (and every step's c after them with ``return_states``).

        The autograd entry point is used only when a gradient is needed, so inference does not
        keep what backward would use. ``functional`` is looked up at call time (so ``apex.amp``
        can patch its entry points).
        """
        tensors = (U, skip, weight_c, self.bias, c0, c_starts)
        needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
        recurrence = functional.sru_recurrence if needs_grad else functional.sru_recurrence_inference
        states = {}
        if return_states:  # the per-step states exist only where the autograd entry stores them
            recurrence, states = functional.sru_recurrence, {"return_states": True}
        outputs = recurrence(
            U,
            skip,
            weight_c,
            self.bias,
            c0,
            scale_x=self.scale_x if self.rescale else None,
            mask_c=mask_c,
            mask_pad=mask_pad,
            reset=reset,
            c_starts=c_starts,
            bidirectional=self.bidirectional,
            has_skip_term=has_skip_term,
            policy=self.recurrence_policy,
            **states,
        )
        h, *rest = outputs
        if self.layer_norm is not None and self.normalize_after:
            h = self.layer_norm(h)
        return (h, *rest)


# ---------------------------------------------------------------------- a stack of layers
class StackMixin(RefusesTorchScript):
    """What :class:`SRU` and :class:`SRUpp` share: both hold their layers in ``rnn_lst`` and
    set ``num_layers``, ``hidden_size``, ``num_directions``, ``output_size`` and
    ``nn_rnn_compatible_return``."""

    rnn_lst: Sequence
    num_layers: int
    hidden_size: int
    num_directions: int
    output_size: int
    nn_rnn_compatible_return: bool

    @property
    def recurrence_policy(self) -> str:
        """The layers' policy ("mixed" if they were set differently one by one)."""
        policies = {wrapped_layer(layer).recurrence_policy for layer in self.rnn_lst}
        return policies.pop() if len(policies) == 1 else "mixed"

    @recurrence_policy.setter
    def recurrence_policy(self, policy: str) -> None:
        policy = checked_policy(type(self).__name__, policy)
        for layer in self.rnn_lst:
            wrapped_layer(layer).recurrence_policy = policy

    def _layer_initial_states(
        self, owner: str, c0: Tensor | None, batch: int, device: torch.device
    ) -> list[Tensor | None]:
        """``c0`` (num_layers, B, dirs*hidden_size) checked and split per layer (None: zeros)."""
        if c0 is None:
            return [None] * self.num_layers
        check_floating_tensor(owner, "c0", c0)
        check_shape(
            owner, "c0", c0, (self.num_layers, batch, self.output_size), "(num_layers, batch, dirs*hidden_size)"
        )
        check_same_device(owner, "c0", c0, device, "the input's")
        return list(c0.unbind(0))

    def _stacked_last_states(self, last_states: list[Tensor], batch: int) -> Tensor:
        """The layers' last c as (num_layers, B, dirs*hidden_size), or in the ``nn.LSTM``
        layout (num_layers*dirs, B, hidden_size) with ``nn_rnn_compatible_return``."""
        c_stack = torch.stack(last_states)
        if self.nn_rnn_compatible_return:
            c_stack = (
                c_stack.view(self.num_layers, batch, self.num_directions, self.hidden_size)
                .transpose(1, 2)
                .reshape(self.num_layers * self.num_directions, batch, self.hidden_size)
            )
        return c_stack


def unpack_sequence(
    owner: str, input: PackedSequence, mask_pad: Tensor | None, device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """A ``PackedSequence`` as (padded (L, B, ...), lengths, padding mask (L, B) bool);
    ``mask_pad`` must be None since the lengths give the padding."""
    if mask_pad is not None:
        raise ValueError(
            f"{owner}: `mask_pad` must be None for a PackedSequence input (padding is "
            f"taken from its lengths), got a tensor of shape {tuple(mask_pad.shape)}"
        )
    padded, lengths = pad_packed_sequence(input)
    steps = torch.arange(padded.shape[0]).unsqueeze(1)
    return padded, lengths, (steps >= lengths.unsqueeze(0)).to(device)
