"""One SRU layer: a matrix product in plain PyTorch followed by the elementwise recurrence.

The matrix product ``U = x @ W`` is ordinary PyTorch, so autocast, DeepSpeed and APEX decide
its dtype exactly as they do for ``nn.Linear``. The recurrence goes through
``sru_lightning.ops.functional`` looked up at call time (so ``apex.amp`` can patch the entry
points), and the op casts its inputs to the storage dtype chosen by ``recurrence_policy``.

Parameter names, shapes and the initialisation recipe are those of ``sru.SRUCell`` 2.6, so
its state dicts load unchanged.
"""

from __future__ import annotations

import math
import numbers
import warnings

import torch
from torch import Tensor, nn

from sru_lightning.ops.projection import input_projection, input_projection_with_skip
from sru_lightning.ops.storage_dtype import HALF_DTYPES, active_autocast_dtype, resolve_storage_dtype

from .checks import (
    check_floating_tensor,
    check_input_dtype,
    check_non_negative_int,
    check_positive_int,
    check_probability,
    check_same_device,
    check_shape,
    time_major_padding_mask,
    to_time_major,
)
from .common import (
    RecurrentCellMixin,
    checked_policy,
    non_default_settings,
    refuse_jit_trace,
    store_settings,
    time_shared_dropout_mask,
    warn_rnn_dropout,
    zero_padded_steps,
)
from .configs import SRUCellConfig
from .pretrained import PretrainedLayer


def resolve_amp_flag(owner: str, amp_recurrence_fp16: bool, recurrence_policy: str) -> str:
    """Map the ``sru`` package's ``amp_recurrence_fp16`` onto a recurrence policy.

    ``amp_recurrence_fp16=True`` asks for a half-precision recurrence under autocast, which
    is the ``"half"`` policy; ``False`` leaves ``recurrence_policy`` in charge.
    """
    if not amp_recurrence_fp16:
        return recurrence_policy
    if recurrence_policy == "fp32":
        raise ValueError(
            f"{owner}: `amp_recurrence_fp16=True` asks for a half recurrence but "
            f"`recurrence_policy` is 'fp32'; expected recurrence_policy 'auto' or 'half', got 'fp32'"
        )
    return "half"


def _check_cell_options(owner: str, use_tanh, highway_bias, weight_c_init, custom_m) -> None:
    """Refuse the options of an SRU layer that are not sizes or rates (those are checked as stored)."""
    if use_tanh:
        raise ValueError(
            f"{owner}: `use_tanh` must be False (the tanh activation, deprecated in the sru "
            f"package, is not supported by this recurrence), got {use_tanh!r}"
        )
    if isinstance(highway_bias, bool) or not isinstance(highway_bias, numbers.Real):
        raise TypeError(f"{owner}: `highway_bias` must be a float, got {type(highway_bias).__name__}")
    if weight_c_init is not None and (
        isinstance(weight_c_init, bool) or not isinstance(weight_c_init, numbers.Real) or weight_c_init <= 0
    ):
        raise ValueError(f"{owner}: `weight_c_init` must be None or a positive float, got {weight_c_init!r}")
    if custom_m is not None and not isinstance(custom_m, nn.Module):
        raise TypeError(f"{owner}: `custom_m` must be an nn.Module or None, got {type(custom_m).__name__}")


class SRUCell(PretrainedLayer, RecurrentCellMixin, nn.Module):
    """A single SRU layer (one or two directions).

    Shapes (time-major by default, ``batch_first=True`` swaps the first two axes of
    ``input``, ``mask_pad`` and the output):

    * ``input``: (L, B, input_size), or (B, input_size) for one time step;
    * ``c0``: (B, dirs*hidden_size), zeros when omitted;
    * ``reset``: the layout of ``mask_pad``, non-zero/True at each document's first step: documents
      packed into one row are computed as if each were alone (the state restarts from zero there,
      in both directions; see :func:`sru_lightning.ops.functional.sru_recurrence`);
    * ``c_starts`` (with ``reset``): the layout of ``input`` with dirs*hidden_size features, the
      state each document starts from instead of zero (read only where a document starts; its
      gradient is exact);
    * ``mask_pad``: (L, B) (or (B,) for one step), non-zero/True marks padding: a padded
      step keeps ``c`` and emits ``h = 0``;
    * returns ``h`` (L, B, dirs*hidden_size) (or (B, dirs*hidden_size) for one step) and the
      last ``c`` (B, dirs*hidden_size); with ``return_states=True`` also every step's ``c`` in
      ``h``'s layout (a packed document's final state is its last step's, with its gradient).

    Keyword names are those of ``sru.SRUCell`` 2.6. Differences, all deliberate:

    * ``use_tanh=True`` (deprecated in ``sru``) is refused: the recurrence has no tanh.
    * ``rnn_dropout`` (deprecated in ``sru``) works as there -- one mask on the layer input
      shared over time -- and warns with ``FutureWarning``.
    * ``v1=True`` fixes ``weight_c`` at zero (not trained), as in ``sru``.
    * ``amp_recurrence_fp16=True`` selects ``recurrence_policy="half"``.
    * ``n_proj`` is used only when it is smaller than both ``input_size`` and the output
      size (otherwise the factorisation would not save anything), as in ``sru``.
    * One-step (2-D) input returns a 2-D ``h``.

    ``recurrence_policy`` ("auto", "fp32" or "half") picks the dtype the recurrence stores
    its tensors in; see :func:`sru_lightning.nn.set_recurrence_policy`.
    """

    config_class = SRUCellConfig

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        dropout: float = 0.0,
        rnn_dropout: float = 0.0,
        bidirectional: bool = False,
        n_proj: int = 0,
        use_tanh: bool = False,
        highway_bias: float = 0.0,
        has_skip_term: bool = True,
        layer_norm: bool = False,
        rescale: bool = True,
        v1: bool = False,
        custom_m: nn.Module | None = None,
        amp_recurrence_fp16: bool = False,
        normalize_after: bool = False,
        weight_c_init: float | None = None,
        *,
        recurrence_policy: str = "auto",
        batch_first: bool = False,
    ):
        super().__init__()
        self._keep_config(locals())
        owner = type(self).__name__
        self.input_size = check_positive_int(owner, "input_size", input_size)
        self.hidden_size = check_positive_int(owner, "hidden_size", hidden_size)
        self.dropout = check_probability(owner, "dropout", dropout)
        self.rnn_dropout = check_probability(owner, "rnn_dropout", rnn_dropout)
        n_proj = check_non_negative_int(owner, "n_proj", n_proj)
        _check_cell_options(owner, use_tanh, highway_bias, weight_c_init, custom_m)
        if self.rnn_dropout > 0:
            warn_rnn_dropout(owner)
        store_settings(
            self,
            bidirectional=bidirectional,
            highway_bias=highway_bias,
            has_skip_term=has_skip_term,
            rescale=rescale,
            v1=v1,
            normalize_after=normalize_after,
            weight_c_init=weight_c_init,
            amp_recurrence_fp16=amp_recurrence_fp16,
            batch_first=batch_first,
        )
        self.recurrence_policy = resolve_amp_flag(
            owner, self.amp_recurrence_fp16, checked_policy(owner, recurrence_policy)
        )
        self._choose_matrix_layout(n_proj)
        self.custom_m = custom_m
        self._add_input_weights()
        self._add_recurrence_parameters(layer_norm)
        self.reset_parameters()

    def _choose_matrix_layout(self, n_proj: int) -> None:
        """The projection size (0: none) and the number of matrices k that U holds."""
        # A factorised U = (x @ P) @ W only pays off when the inner size is the smallest.
        self.projection_size = n_proj if 0 < n_proj < min(self.input_size, self.output_size) else 0
        # k = 4 carries its own skip column in U when the input cannot be added to h directly.
        self.num_matrices = 4 if self.has_skip_term and self.input_size != self.output_size else 3

    def _add_input_weights(self) -> None:
        """Register weight_proj and weight (None when `custom_m` computes U), uninitialised."""
        if self.custom_m is not None:
            self.register_parameter("weight_proj", None)
            self.register_parameter("weight", None)
            return
        inner = self.projection_size or self.input_size
        if self.projection_size:
            self.weight_proj = nn.Parameter(torch.empty(self.input_size, self.projection_size))
        else:
            self.register_parameter("weight_proj", None)
        self.weight = nn.Parameter(torch.empty(inner, self.output_size * self.num_matrices))

    # ------------------------------------------------------------------ init
    def reset_parameters(self) -> None:
        """Initialise as the ``sru`` package does (same recipe, same random-number order).

        W ~ U(-sqrt(3/fan_in), sqrt(3/fan_in)) so E[w]=0, Var[w]=1/fan_in; the candidate
        column is shrunk by sqrt(1-dropout) to undo dropout's variance boost, everything by
        0.1 under layer norm, the gate columns and weight_c by sqrt(0.5) so each gate's
        pre-activation keeps unit variance, and the k=4 skip column by the highway scale.
        """
        with torch.no_grad():
            self._initialise()

    def _initialise(self) -> None:
        skip_scale = (1 + math.exp(self.highway_bias) * 2) ** 0.5
        self.bias.zero_()
        self.bias[self.output_size :].fill_(self.highway_bias)
        self.scale_x.fill_(skip_scale if self.rescale and self.has_skip_term else 1.0)

        blocks = None
        if self.custom_m is None:
            fan_in = self.weight.shape[0]
            self.weight.uniform_(-((3.0 / fan_in) ** 0.5), (3.0 / fan_in) ** 0.5)
            if self.weight_proj is not None:
                bound = (3.0 / self.input_size) ** 0.5
                self.weight_proj.uniform_(-bound, bound)
            blocks = self.weight.view(fan_in, self.num_directions, self.hidden_size, self.num_matrices)
            if self.dropout > 0:
                blocks[..., 0].mul_((1 - self.dropout) ** 0.5)
            if self.rnn_dropout > 0:
                blocks.mul_((1 - self.rnn_dropout) ** 0.5)
            if self.layer_norm is not None:
                blocks.mul_(0.1)
            if self.rescale and self.has_skip_term and self.num_matrices == 4:
                blocks[..., 3].mul_(skip_scale)
        elif hasattr(self.custom_m, "reset_parameters"):
            self.custom_m.reset_parameters()
        else:
            warnings.warn(
                f"{type(self).__name__}: custom_m {type(self.custom_m).__name__} has no "
                "reset_parameters(); its parameters keep their current values",
                stacklevel=4,
            )

        if self.v1:
            self.weight_c.zero_()
            self.weight_c.requires_grad_(False)
            return
        if self.weight_c_init is None:
            self.weight_c.uniform_(-(3.0**0.5), 3.0**0.5)
            self.weight_c.mul_(0.5**0.5)
        else:
            self.weight_c.uniform_(-self.weight_c_init, self.weight_c_init)
        if blocks is not None:
            blocks[..., 1].mul_(0.5**0.5)
            blocks[..., 2].mul_(0.5**0.5)

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input: Tensor,
        c0: Tensor | None = None,
        mask_pad: Tensor | None = None,
        reset: Tensor | None = None,
        *,
        c_starts: Tensor | None = None,
        return_states: bool = False,
    ) -> tuple[Tensor, ...]:
        owner = type(self).__name__
        refuse_jit_trace(owner)
        device = self.bias.device
        x, one_step = to_time_major(owner, input, self.input_size, self.batch_first, device)
        length, batch = x.shape[0], x.shape[1]
        if self.custom_m is None:
            check_input_dtype(owner, x, self.weight.dtype)
        if c0 is not None:
            check_floating_tensor(owner, "c0", c0)
            check_shape(owner, "c0", c0, (batch, self.output_size), "(batch, dirs*hidden_size)")
            check_same_device(owner, "c0", c0, device, "the input's")
        if mask_pad is not None:
            mask_pad = time_major_padding_mask(owner, mask_pad, length, batch, one_step, self.batch_first, device)
        if reset is not None:
            reset = time_major_padding_mask(owner, reset, length, batch, one_step, self.batch_first, device, "reset")
        if c_starts is not None:
            check_floating_tensor(owner, "c_starts", c_starts)
            check_same_device(owner, "c_starts", c_starts, device, "the input's")
            c_starts = c_starts.unsqueeze(0) if one_step else c_starts
            c_starts = c_starts.transpose(0, 1) if self.batch_first and not one_step else c_starts

        h, c, *states = self.forward_time_major(x, c0, mask_pad, reset, c_starts, return_states)
        if one_step:
            return (h.squeeze(0), c, *(s.squeeze(0) for s in states))
        if self.batch_first:
            h, states = h.transpose(0, 1), [s.transpose(0, 1) for s in states]
        return (h, c, *states)

    def forward_time_major(
        self,
        x: Tensor,
        c0: Tensor | None,
        mask_pad: Tensor | None,
        reset: Tensor | None = None,
        c_starts: Tensor | None = None,
        return_states: bool = False,
    ) -> tuple[Tensor, ...]:
        """The layer on already-checked tensors: x (L, B, input_size), mask_pad and reset (L, B)
        bool, c_starts (L, B, dirs*hidden_size)."""
        x = self._one_half_copy_of_input(zero_padded_steps(x, mask_pad))
        residual = x
        x = self._normalized_input(x)
        batch = x.shape[1]
        if self.training and self.rnn_dropout > 0:
            x = x * self.dropout_mask((batch, self.input_size), self.rnn_dropout)
        mask_c = None
        if self.training and self.dropout > 0:
            mask_c = self.dropout_mask((batch, self.output_size), self.dropout)

        if self._skip_is_projection_input(x, residual):
            # One backward for the projection and the skip term: the skip's gradient is added
            # inside the product of the input's, not in a pass of its own over memory.
            U, skip = input_projection_with_skip(x, self.weight)
            weight_c = self.weight_c
        else:
            U, weight_c = self.compute_uv(x)
            skip = residual if self.has_skip_term and self.num_matrices == 3 else None
        return self._recurrence(
            U,
            skip,
            weight_c,
            c0=c0,
            mask_c=mask_c,
            mask_pad=mask_pad,
            has_skip_term=self.has_skip_term,
            reset=reset,
            c_starts=c_starts,
            return_states=return_states,
        )

    def _skip_is_projection_input(self, x: Tensor, residual: Tensor) -> bool:
        """Whether the skip term reads the very tensor the single projection multiplies (no
        factorised projection, no `custom_m`, no input-side layer norm or `rnn_dropout` between)."""
        return (
            x is residual
            and self.custom_m is None
            and self.weight_proj is None
            and self.has_skip_term
            and self.num_matrices == 3
        )

    def _one_half_copy_of_input(self, x: Tensor) -> Tensor:
        """Under autocast, cast a float32 input once to the half dtype the recurrence stores.

        Otherwise the matmul (autocast) and the skip term (the op boundary) each make their own
        half copy of x and autograd saves both. The values are the ones both casts produce.
        """
        autocast_dtype = active_autocast_dtype(x.device.type)
        if autocast_dtype not in HALF_DTYPES or x.dtype != torch.float32:
            return x
        if self.custom_m is not None or (self.layer_norm is not None and not self.normalize_after):
            return x  # the matmul input is not x itself: nothing would be shared
        if self.training and self.rnn_dropout > 0:
            return x
        if resolve_storage_dtype(self.recurrence_policy, autocast_dtype) != autocast_dtype:
            return x
        return x.to(autocast_dtype)

    def compute_uv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """U (L, B, dirs*hidden*k) and the gate weights on c: weight_c, or V + weight_c per step."""
        length, batch = x.shape[0], x.shape[1]
        u_width = self.output_size * self.num_matrices
        if self.custom_m is None:
            # (L, B, in) @ W as one product over all steps; kept 3-D, so an exported graph has no
            # reshapes around it (input_projection flattens where its kernel needs 2-D).
            if self.weight_proj is not None:
                x = input_projection(x, self.weight_proj)
            return input_projection(x, self.weight), self.weight_c

        owner = type(self).__name__
        result = self.custom_m(x)
        if isinstance(result, (tuple, list)):
            if len(result) not in (1, 2):
                raise ValueError(f"{owner}: `custom_m` must return U or (U, V), got {len(result)} tensors")
            U, V = result[0], (result[1] if len(result) == 2 else None)
        else:
            U, V = result, None
        U = self._per_step(owner, "U", U, u_width, length, batch)
        if V is None:
            return U, self.weight_c
        V = self._per_step(owner, "V", V, 2 * self.output_size, length, batch)
        return U, V + self.weight_c

    @staticmethod
    def _per_step(owner: str, name: str, value, width: int, length: int, batch: int) -> Tensor:
        if not isinstance(value, Tensor):
            raise TypeError(f"{owner}: `custom_m` must return tensors, got {type(value).__name__} for {name}")
        if value.shape[-1] != width or value.numel() != length * batch * width:
            raise ValueError(
                f"{owner}: `custom_m` output {name} must have shape ({length}, {batch}, {width}) "
                f"or ({length * batch}, {width}), got {tuple(value.shape)}"
            )
        return value.reshape(length, batch, width)

    def dropout_mask(self, size: tuple[int, int], p: float) -> Tensor:
        """Inverted-dropout mask shared over time (one Bernoulli draw per batch row and column)."""
        return time_shared_dropout_mask(self.bias, size, p)

    # ------------------------------------------------------------------ repr
    def extra_repr(self) -> str:
        parts = [f"{self.input_size}, {self.hidden_size}"]
        if self.projection_size:
            parts.append(f"projection_size={self.projection_size}")
        parts += non_default_settings(
            self,
            (
                ("dropout", 0.0),
                ("rnn_dropout", 0.0),
                ("bidirectional", False),
                ("highway_bias", 0.0),
                ("has_skip_term", True),
                ("rescale", True),
                ("v1", False),
                ("normalize_after", False),
                ("weight_c_init", None),
                ("batch_first", False),
                ("recurrence_policy", "auto"),
            ),
        )
        if self.layer_norm is not None:
            parts.append("layer_norm=True")
        return ", ".join(parts)
