"""Pure-PyTorch SRU recurrence: the readable specification and the fallback.

For each column (batch b, direction d, hidden unit j) and each step t (t = 0..L-1 for the
forward direction, t = L-1..0 for the backward one, which owns the second half of the
columns)::

    f_t = sigmoid(U1_t + wf * c_{t-1} + bf)             forget gate
    r_t = sigmoid(U2_t + wr * c_{t-1} + br)             reset (highway) gate
    c_t = f_t * c_{t-1} + (1 - f_t) * U0_t
    h_t = r_t * m * c_t + (1 - r_t * m) * x'_t          with skip term
    h_t = r_t * m * c_t                                 without

where x' = scale_x * x (k = 3) or U3 (k = 4), m is the dropout mask ``mask_c`` (1 when
None), and (wf, wr) are ``weight_c`` (a vector, or per step). On padded steps
(``mask_pad`` True) c_t = c_{t-1} and h_t = 0. The activation on c is the identity.

Document boundaries: ``reset`` (L, B) is True at each document's first step. The forward
direction then runs that step from c_{t-1} = 0 (instead of the previous document's state, or
c0), the backward direction runs a document's last step t (where ``reset[t + 1]``) from 0, so
each document of a packed row is computed as if it were alone, and no gradient crosses a
boundary. A flag on a padded step still restarts the carried state. With ``c_starts``
(L, B, dirs*D) a restarted step starts from ``c_starts[t]`` instead of 0 (the state a
document starts from, read only at those steps), and its gradient goes there.

``return_states`` also returns ``c_all`` (L, B, dirs*D), the state after every step
(differentiable): a document's final state is ``c_all`` at its last step.
"""

from __future__ import annotations

import torch

from .shapes import RecurrenceShape, check_recurrence_inputs
from .signature import RecurrenceCall
from .storage_dtype import accumulation_dtype


def sru_recurrence_reference(
    U,
    x,
    weight_c,
    bias,
    c0=None,
    *,
    scale_x=None,
    mask_c=None,
    mask_pad=None,
    bidirectional: bool = False,
    has_skip_term: bool = True,
    compute_dtype: torch.dtype | None = None,
    reset=None,
    c_starts=None,
    return_states: bool = False,
):
    """SRU recurrence with plain autograd. Returns ``(h, c_last)`` in ``U``'s dtype, and
    ``c_all`` after them with ``return_states``.

    ``compute_dtype`` None computes in float32 (float64 for float64 ``U``); a half dtype does
    every operation in that dtype.
    """
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
        c_starts=c_starts,
        bidirectional=bidirectional,
        has_skip_term=has_skip_term,
    )
    check_recurrence_inputs(call)
    h, c_last, c_all = reference_recurrence(call, compute_dtype=compute_dtype)
    return (h, c_last, c_all) if return_states else (h, c_last)


def reference_recurrence(call: RecurrenceCall, *, compute_dtype: torch.dtype | None = None):
    """The recurrence of a checked call (:func:`~sru_lightning.ops.shapes.check_recurrence_inputs`):
    ``(h, c_last, c_all)`` in ``U``'s dtype, ``compute_dtype`` as for :func:`sru_recurrence_reference`."""
    shape = RecurrenceShape.of(call)
    U, x, weight_c, bias, c0 = call.U, call.x, call.weight_c, call.bias, call.c0
    scale_x, mask_c, mask_pad, reset, c_starts = call.scale_x, call.mask_c, call.mask_pad, call.reset, call.c_starts
    out_dtype = U.dtype
    dtype = compute_dtype if compute_dtype is not None else accumulation_dtype(U.dtype)
    L, B, dirs, D, k = shape.length, shape.batch, shape.directions, shape.hidden_size, shape.k

    def cast(t):
        return None if t is None else t.to(dtype)

    with torch.autocast(U.device.type, enabled=False):
        u = cast(U).reshape(L, B, dirs, D, k)
        if shape.per_step_weight_c:
            wc = cast(weight_c).reshape(L, B, dirs, D, 2)
            forget_w, reset_w = wc[..., 0], wc[..., 1]  # (L, B, dirs, D)
        else:
            wc = cast(weight_c).reshape(2, dirs, D)
            forget_w, reset_w = wc[0].expand(L, B, dirs, D), wc[1].expand(L, B, dirs, D)
        forget_b, reset_b = cast(bias).reshape(2, dirs, D)

        if not call.has_skip_term:
            skip = None
        elif k == 4:
            skip = u[..., 3]
        else:
            skip = cast(x).reshape(L, B, dirs, D)
            if scale_x is not None:
                skip = skip * (cast(scale_x).reshape(()) if isinstance(scale_x, torch.Tensor) else scale_x)
        c_init = torch.zeros(B, dirs, D, dtype=dtype, device=U.device) if c0 is None else cast(c0).reshape(B, dirs, D)
        drop = None if mask_c is None else cast(mask_c).reshape(B, dirs, D)
        pad = None if mask_pad is None else mask_pad.reshape(L, B, 1).to(torch.bool)
        starts = None if reset is None else reset.reshape(L, B, 1)
        start_states = None if c_starts is None else cast(c_starts).reshape(L, B, dirs, D)

        h_directions, c_last_directions, c_directions = [], [], []
        for d in range(dirs):
            c_prev = c_init[:, d]
            h_steps, c_steps = [None] * L, [None] * L
            steps = range(L) if d == 0 else range(L - 1, -1, -1)
            for t in steps:
                # the first step of a document in this direction's order starts from zero
                first = t if d == 0 else t + 1
                if starts is not None and first < L:
                    start = torch.zeros_like(c_prev) if start_states is None else start_states[t, :, d]
                    c_prev = torch.where(starts[first], start, c_prev)
                forget = torch.sigmoid(u[t, :, d, :, 1] + forget_w[t, :, d] * c_prev + forget_b[d])
                reset_gate = torch.sigmoid(u[t, :, d, :, 2] + reset_w[t, :, d] * c_prev + reset_b[d])
                c_t = forget * c_prev + (1 - forget) * u[t, :, d, :, 0]
                if pad is not None:
                    c_t = torch.where(pad[t], c_prev, c_t)
                gate = reset_gate if drop is None else reset_gate * drop[:, d]
                if skip is None:
                    h_t = gate * c_t
                else:
                    h_t = gate * c_t + (1 - gate) * skip[t, :, d]
                if pad is not None:
                    h_t = torch.where(pad[t], torch.zeros_like(h_t), h_t)
                h_steps[t], c_steps[t] = h_t, c_t
                c_prev = c_t
            h_directions.append(torch.stack(h_steps) if L else u.new_zeros(0, B, D))  # (L, B, D)
            c_directions.append(torch.stack(c_steps) if L else u.new_zeros(0, B, D))
            c_last_directions.append(c_prev)
        h = torch.stack(h_directions, dim=2).reshape(L, B, dirs * D)
        c_last = torch.stack(c_last_directions, dim=1).reshape(B, dirs * D)
        c_all = torch.stack(c_directions, dim=2).reshape(L, B, dirs * D)
        if shape.single_step:
            h, c_all = h[0], c_all[0]
    return h.to(out_dtype), c_last.to(out_dtype), c_all.to(out_dtype)
