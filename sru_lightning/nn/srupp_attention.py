"""The input transforms of SRU++ layers: self-attention, or a projected linear without it.

Each computes U, the recurrence's input, from a layer input of shape (L, B, in_features),
through a bottleneck of ``proj_features`` columns. Both take the same keyword arguments
(``mask_pad``, ``attn_mask``, ``memory``, ``memory_mask_pad``, ``reset``, ``memory_reset``) so
a layer calls either one the same way; the projected linear ignores everything but the input.

Parameter names and layouts (``linear1``/``linear2``/``linear3`` as ``nn.Linear`` without
bias, ``alpha``, ``layer_norm``) are those of the ``sru`` 3.0.0-dev SRU++ modules, so their
state dicts load unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checks import check_positive_int, check_probability


def _xavier_without_bias(*linears: nn.Linear, dropout: float) -> None:
    """Xavier-uniform weights in the given order (one random stream), then the last matrix,
    which reads the dropped-out features, shrunk by sqrt(1 - dropout) to keep the output's
    variance. Called under ``torch.no_grad()``."""
    for linear in linears:
        nn.init.xavier_uniform_(linear.weight)
    if dropout > 0:
        linears[-1].weight.mul_((1 - dropout) ** 0.5)


class _FiniteBothWays(torch.autograd.Function):
    """NaN and Inf set to zero, in the tensor (forward) and in its gradient (backward)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.nan_to_num(0.0, posinf=0.0, neginf=0.0)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.nan_to_num(0.0, posinf=0.0, neginf=0.0)


def _finite(x: Tensor) -> Tensor:
    return _FiniteBothWays.apply(x) if x.requires_grad else x.nan_to_num(0.0, posinf=0.0, neginf=0.0)


def _broken_rows(x: Tensor) -> Tensor:
    """(..., S, d) -> (..., S): True where a row holds a NaN or Inf. 0 x v is 0 for a finite v
    and NaN otherwise, and a sum of zeros cannot overflow: one cheap reduction."""
    return (x.detach() * 0).sum(-1).isnan()


def attention_within_documents(queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor, dropout_p: float) -> Tensor:
    """Attention (B, heads, L, head_dim) in which a pair that ``mask`` sets to -inf contributes
    exactly nothing, forward and backward, even when one side holds a NaN or Inf.

    Keys and values are shared by the queries of every document of a row, and a product over
    all pairs multiplies a masked pair's weight 0 (forward) or gradient 0 (backward) by its
    value: one non-finite value in a document would reach every other document as 0 x NaN. So
    the products see only finite numbers (NaN and Inf zeroed in queries, keys and values, and in
    the gradient that comes back), and a query that is non-finite or attends (by ``mask``) to a
    non-finite key or value gets NaN. For finite tensors this is the plain attention, bit for bit.
    """
    broken_keys = _broken_rows(keys) | _broken_rows(values)  # (B, heads, S)
    attends = ~mask.isneginf()  # (B or 1, 1, L, S)
    reaches_broken = (attends & broken_keys[:, :, None, :]).any(-1) | _broken_rows(queries)  # (B, heads, L)
    attended = F.scaled_dot_product_attention(
        _finite(queries), _finite(keys), _finite(values), attn_mask=mask, dropout_p=dropout_p
    )
    return torch.where(reaches_broken[..., None], float("nan"), _finite(attended))


class SRUppProjectedLinear(nn.Module):
    """U = linear2(dropout(norm(linear1(x)))): the transform of SRU++ layers without attention.

    ``layer_norm`` normalises the ``proj_features``-wide bottleneck. ``dropout`` acts on the
    bottleneck before the second matrix, whose initial weights shrink by sqrt(1 - dropout)
    to keep the output's variance.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        proj_features: int,
        dropout: float = 0.0,
        layer_norm: bool = False,
    ):
        super().__init__()
        owner = type(self).__name__
        self.in_features = check_positive_int(owner, "in_features", in_features)
        self.out_features = check_positive_int(owner, "out_features", out_features)
        self.proj_features = check_positive_int(owner, "proj_features", proj_features)
        self.dropout = nn.Dropout(check_probability(owner, "dropout", dropout))
        self.linear1 = nn.Linear(self.in_features, self.proj_features, bias=False)
        self.linear2 = nn.Linear(self.proj_features, self.out_features, bias=False)
        self.layer_norm = nn.LayerNorm(self.proj_features) if layer_norm else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            _xavier_without_bias(self.linear1, self.linear2, dropout=self.dropout.p)

    def forward(
        self,
        input: Tensor,
        mask_pad: Tensor | None = None,
        attn_mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask_pad: Tensor | None = None,
        reset: Tensor | None = None,
        memory_reset: Tensor | None = None,
    ) -> Tensor:
        bottleneck = self.linear1(input)
        if self.layer_norm is not None:
            bottleneck = self.layer_norm(bottleneck)
        return self.linear2(self.dropout(bottleneck))


class SRUppAttention(nn.Module):
    """Multi-head self-attention producing U for an SRU++ layer.

    z = linear1(x) (proj_features wide); queries are z, keys and values ``linear2(z)``
    split in two; heads of ``proj_features // num_heads`` columns; the heads' output is added
    back to z through the learned scale ``alpha`` (``rezero_init_alpha`` at the start), then
    ``linear3`` widens it to ``out_features``. With ``memory`` (M, B, in_features) the keys
    and values also cover the memory, placed before the current input, so ``attn_mask`` is
    (L, M + L). ``layer_norm`` normalises z before attention (``normalize_after=False``) or
    the residual sum after it (True).

    Shapes are time-major: input (L, B, in_features), ``mask_pad`` (L, B) and
    ``memory_mask_pad`` (M, B) with True (non-zero) on padding, additive float ``attn_mask``
    (L, M + L), ``reset`` (L, B) and ``memory_reset`` (M, B) True at each document's first
    step: no position attends to another document's (see :meth:`_document_mask`). The stack
    :class:`~sru_lightning.nn.SRUpp` checks its arguments; this module trusts them.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        proj_features: int,
        num_heads: int = 1,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        rezero_init_alpha: float = 0.0,
        layer_norm: bool = False,
        normalize_after: bool = True,
    ):
        super().__init__()
        owner = type(self).__name__
        self.in_features = check_positive_int(owner, "in_features", in_features)
        self.out_features = check_positive_int(owner, "out_features", out_features)
        self.proj_features = check_positive_int(owner, "proj_features", proj_features)
        self.num_heads = check_positive_int(owner, "num_heads", num_heads)
        if self.proj_features % self.num_heads:
            raise ValueError(
                f"{owner}: `num_heads` must divide proj_features={self.proj_features}, got {self.num_heads}"
            )
        self.head_dim = self.proj_features // self.num_heads
        self.dropout = nn.Dropout(check_probability(owner, "dropout", dropout))
        self.attn_dropout = check_probability(owner, "attn_dropout", attn_dropout)
        self.rezero_init_alpha = float(rezero_init_alpha)
        self.normalize_after = bool(normalize_after)
        self.linear1 = nn.Linear(self.in_features, self.proj_features, bias=False)
        self.linear2 = nn.Linear(self.proj_features, 2 * self.proj_features, bias=False)
        self.linear3 = nn.Linear(self.proj_features, self.out_features, bias=False)
        self.alpha = nn.Parameter(torch.full((1,), self.rezero_init_alpha))
        self.layer_norm = nn.LayerNorm(self.proj_features) if layer_norm else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            _xavier_without_bias(self.linear1, self.linear2, self.linear3, dropout=self.dropout.p)
            self.alpha.fill_(self.rezero_init_alpha)

    def forward(
        self,
        input: Tensor,
        mask_pad: Tensor | None = None,
        attn_mask: Tensor | None = None,
        memory: Tensor | None = None,
        memory_mask_pad: Tensor | None = None,
        reset: Tensor | None = None,
        memory_reset: Tensor | None = None,
    ) -> Tensor:
        length, batch = input.shape[0], input.shape[1]
        memory_length = 0 if memory is None else memory.shape[0]
        context = input if memory is None else torch.cat([memory, input], dim=0)
        z = self.linear1(context)
        residual = z[memory_length:]
        if self.layer_norm is not None and not self.normalize_after:
            z = self.layer_norm(z)
        keys, values = self.linear2(z).chunk(2, dim=-1)

        queries = self._split_heads(z[memory_length:])
        keys, values = self._split_heads(keys), self._split_heads(values)
        mask = self._combined_mask(
            attn_mask, mask_pad, memory_mask_pad, length, memory_length, batch, input.device, queries.dtype
        )
        dropout_p = self.attn_dropout if self.training else 0.0
        if reset is None:
            attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, dropout_p=dropout_p)
        else:
            mask = self._document_mask(mask, reset, memory_reset, length, memory_length, batch, queries.dtype)
            attended = attention_within_documents(queries, keys, values, mask, dropout_p)
        # (B, heads, L, head_dim) -> (L, B, proj_features), heads side by side.
        attended = attended.permute(2, 0, 1, 3).reshape(length, batch, self.proj_features)

        output = attended * self.alpha + residual
        if self.layer_norm is not None and self.normalize_after:
            output = self.layer_norm(output)
        return self.linear3(self.dropout(output))

    @staticmethod
    def _document_mask(
        mask: Tensor | None,
        reset: Tensor,
        memory_reset: Tensor | None,
        length: int,
        memory_length: int,
        batch: int,
        dtype: torch.dtype,
    ) -> Tensor:
        """`mask` (or none) with attention across documents blocked: (B, 1, L, M + L).

        A position's document id is the number of document starts (`reset`, (L, B)) up to and
        including it, so the document in progress when the call begins is 0. Memory positions
        carry 0 too (the document in progress at the end of the memory): a query attends to
        the memory only until its row starts a new document. With `memory_reset` (M, B) the
        memory's own documents count down from it (the last is 0, earlier ones negative), so
        memory from a document that ended inside the memory is never attended to.
        """
        reset = reset.to(torch.bool)
        query_ids = torch.cumsum(reset.to(torch.int32), dim=0)  # (L, B)
        key_ids = query_ids
        if memory_length:
            if memory_reset is None:
                memory_ids = query_ids.new_zeros(memory_length, batch)
            else:
                counts = torch.cumsum(memory_reset.to(torch.bool).to(torch.int32), dim=0)
                memory_ids = counts - counts[-1:]
            key_ids = torch.cat([memory_ids, query_ids], dim=0)  # (M + L, B)
        other_document = query_ids.t()[:, :, None] != key_ids.t()[:, None, :]  # (B, L, M + L)
        if mask is None:
            mask = torch.zeros(1, 1, length, memory_length + length, dtype=dtype, device=reset.device)
        return mask.masked_fill(other_document[:, None], float("-inf"))

    def _split_heads(self, x: Tensor) -> Tensor:
        """(S, B, proj_features) -> (B, heads, S, head_dim)."""
        return x.reshape(x.shape[0], x.shape[1], self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    @staticmethod
    def _combined_mask(
        attn_mask: Tensor | None,
        mask_pad: Tensor | None,
        memory_mask_pad: Tensor | None,
        length: int,
        memory_length: int,
        batch: int,
        device: torch.device,
        dtype: torch.dtype,
    ) -> Tensor | None:
        """One additive mask (B or 1, 1, L, M + L) from the attention mask and the padding."""
        mask = None if attn_mask is None else attn_mask.to(dtype).reshape(1, 1, length, memory_length + length)
        if mask_pad is None and memory_mask_pad is None:
            return mask
        if mask_pad is None:
            mask_pad = torch.zeros(length, batch, dtype=torch.bool, device=device)
        if memory_length:
            if memory_mask_pad is None:
                memory_mask_pad = torch.zeros(memory_length, batch, dtype=torch.bool, device=device)
            mask_pad = torch.cat([memory_mask_pad.to(torch.bool), mask_pad.to(torch.bool)], dim=0)
        padded_keys = mask_pad.to(torch.bool).t().reshape(batch, 1, 1, memory_length + length)
        if mask is None:
            mask = torch.zeros(1, 1, length, memory_length + length, dtype=dtype, device=device)
        return mask.masked_fill(padded_keys, float("-inf"))
