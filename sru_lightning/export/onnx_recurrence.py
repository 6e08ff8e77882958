"""The recurrence op as standard ONNX: one ``Scan`` that onnxruntime (or any ONNX runtime) runs
without this package.

Written for the speed of a per-step interpreter, where every node of the loop body costs a
dispatch at every step:

* both directions run in one Scan: the backward direction's inputs are reversed in time once,
  so step t of the Scan holds the forward direction's step t and the backward direction's
  step L-1-t side by side (state (B, dirs, D); (B, D) for one direction);
* U (L, B, [dirs,] D, k) is transposed once to (k, L, B, [dirs,] D), so each scan input is one
  contiguous block;
* only the cell state depends on the previous step, so the body computes just
  ``f = sigmoid(U1 + wf*c + bf); c = U0 + f*(c - U0)`` (with the gate weights from the outer
  scope); the reset gate and h, which need only the previous c (a second per-step output of
  the Scan), are computed for all steps at once after it, on whole tensors;
* with one direction the tensors carry no direction axis, so the state needs no reshapes.

Document starts (``reset``) are one more scan input: a step that starts a document reads a
previous state of zero. Only options that inference uses are translated; a dropout mask (``mask_c``, training) or
per-step ``weight_c`` (``custom_m``) raise :class:`~sru_lightning.export.graph_module.ExportError`.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import opset20 as op

from sru_lightning.ops.signature import RecurrenceCall

from .graph_module import ExportError

OPSET = 20


def _node(graph_nodes: list, op_type: str, *inputs, **attributes) -> ir.Value:
    node = ir.Node(
        "",
        op_type,
        inputs=list(inputs),
        attributes=[ir.convenience.convert_attribute(k, v) for k, v in attributes.items()],
    )
    graph_nodes.append(node)
    return node.outputs[0]


def _cell_scan_body(
    forget_weight: ir.Value, masked: bool, restarting: bool = False, given_starts: bool = False
) -> ir.Graph:
    """The loop body: state c (B, [dirs,] D); scan inputs U0, U1 + bf (and the padding, the
    document starts, and the states they start from); outputs the new c and, per step, the new c
    and the previous one (which the reset gate reads). A step that starts a document reads a
    previous c of zero, or its given start state."""
    float_type = ir.TensorType(ir.DataType.FLOAT)
    c_carried = ir.Value(name="c_carried", type=float_type)
    candidate = ir.Value(name="u_candidate", type=float_type)
    forget_in = ir.Value(name="u_forget", type=float_type)
    inputs = [c_carried, candidate, forget_in]
    pad = ir.Value(name="pad", type=ir.TensorType(ir.DataType.BOOL)) if masked else None
    restart = ir.Value(name="restart", type=ir.TensorType(ir.DataType.BOOL)) if restarting else None
    start_state = ir.Value(name="start_state", type=float_type) if given_starts else None
    inputs += [value for value in (pad, restart, start_state) if value is not None]
    nodes: list = []
    c_prev = c_carried
    if restart is not None:
        start = start_state if start_state is not None else _node(nodes, "Constant", value_float=0.0)
        c_prev = _node(nodes, "Where", restart, start, c_carried)
    forget = _node(nodes, "Sigmoid", _node(nodes, "Add", forget_in, _node(nodes, "Mul", forget_weight, c_prev)))
    c_new = _node(nodes, "Add", candidate, _node(nodes, "Mul", forget, _node(nodes, "Sub", c_prev, candidate)))
    if pad is not None:
        c_new = _node(nodes, "Where", pad, c_prev, c_new)
    c_step = _node(nodes, "Identity", c_new)
    return ir.Graph(inputs, [c_new, c_step, c_prev], nodes=nodes, opset_imports={"": OPSET}, name="sru_cell_step")


def _scan(c_init, scan_inputs: list, body: ir.Graph) -> tuple:
    """A Scan node with its three outputs: the final state, and per step the state after and before.

    The exporter's op recorder gives a variadic-output op one output, so the node is built here
    and appended to the recorder's nodes directly.
    """
    import onnxscript.evaluator

    recorder = onnxscript.evaluator.default()
    if not isinstance(getattr(recorder, "nodes", None), list):
        raise ExportError(
            f"this torch.onnx exporter records nodes in {type(recorder).__name__}, which has no node list; "
            "expected torch's dynamo ONNX exporter (torch 2.6 or newer)"
        )
    node = ir.Node(
        "",
        "Scan",
        inputs=[c_init, *scan_inputs],
        num_outputs=3,
        version=OPSET,
        attributes=[
            ir.convenience.convert_attribute("body", body),
            ir.convenience.convert_attribute("num_scan_inputs", len(scan_inputs)),
        ],
    )
    recorder.nodes.append(node)
    return tuple(node.outputs)


def _scalar(value):
    """A one-element tensor as a scalar."""
    return op.Reshape(value, op.Constant(value_ints=[]))


def _gate_vectors(vector, column_shape: list) -> tuple:
    """The (forget, reset) halves of weight_c or bias, each of `column_shape` ((dirs, D) or (D,)).

    Gathers rather than one Split: single-output ops, which the exporter's optimiser folds into
    constants (the weights are initializers by then)."""
    halves = op.Reshape(vector, op.Constant(value_ints=[2, *column_shape]))
    return tuple(op.Gather(halves, op.Constant(value_int=index), axis=0) for index in (0, 1))


def _time_aligned(value, directions: int, axis: int = 2):
    """(L, B, dirs, ...) with the backward direction reversed in time (identity for one direction)."""
    if directions == 1:
        return value
    forward, backward = op.Split(value, axis=axis, num_outputs=2)
    reversed_backward = op.Slice(
        backward,
        op.Constant(value_ints=[-1]),
        op.Constant(value_ints=[-(2**62)]),
        op.Constant(value_ints=[0]),
        op.Constant(value_ints=[-1]),
    )
    return op.Concat(forward, reversed_backward, axis=axis)


def _restarts(reset, directions: int):
    """Per scan step, whether the state entering it is zero: (L, B, 1), or (L, B, dirs, 1) time-aligned.
    The forward direction restarts where a document starts (``reset[t]``), the backward one at a
    document's last step (``reset[t + 1]``, False at the last step)."""
    if directions == 1:
        return op.Unsqueeze(reset, op.Constant(value_ints=[2]))
    first_row = op.Slice(reset, op.Constant(value_ints=[0]), op.Constant(value_ints=[1]), op.Constant(value_ints=[0]))
    later = op.Slice(reset, op.Constant(value_ints=[1]), op.Constant(value_ints=[2**62]), op.Constant(value_ints=[0]))
    next_starts = op.Concat(later, op.And(first_row, op.Not(first_row)), axis=0)  # reset[t + 1], then False
    per_direction = [op.Unsqueeze(flags, op.Constant(value_ints=[2, 3])) for flags in (reset, next_starts)]
    return _time_aligned(op.Concat(*per_direction, axis=2), directions)


def recurrence_forward(
    U,
    x,
    weight_c,
    bias,
    c0,
    scale_x,
    scale_x_value: float,
    mask_c,
    mask_pad,
    reset,
    c_starts,
    bidirectional: bool,
    has_skip_term: bool,
    store_c: bool,
):
    """ONNX translation of ``torch.ops.sru_lightning.recurrence_forward``: (h, c_last, c_all), c_all
    empty unless ``store_c``.

    The exporter matches these parameters to the op's schema by name, so they are the op's
    arguments (:data:`~sru_lightning.ops.signature.FORWARD_ARGUMENTS`); they become one call here.
    """
    return _recurrence_graph(RecurrenceCall.from_op(locals()), store_c=store_c)


def _recurrence_graph(call: RecurrenceCall, *, store_c: bool):
    """The graph of one call: its tensors are ONNX values; its flags, and ``scale_x`` when a float, are constants."""
    U, x, weight_c, bias, c0 = call.U, call.x, call.weight_c, call.bias, call.c0
    mask_pad, reset, c_starts = call.mask_pad, call.reset, call.c_starts
    if call.mask_c is not None:
        raise ExportError("the recurrence has a dropout mask (`mask_c`, training only); export the model in eval mode")
    if len(weight_c.shape) != 1:
        raise ExportError(
            "the recurrence has per-step `weight_c` (from `custom_m`, not supported in export); "
            f"expected a vector of 2*dirs*hidden, got rank {len(weight_c.shape)}"
        )
    directions = 2 if call.bidirectional else 1
    hidden = bias.shape[0] // (2 * directions)
    k = U.shape[-1] // (directions * hidden)

    # The gate biases as one add on U (zeros in the other columns) right after the product that
    # made U, instead of one add per gate; the exporter's optimiser folds the vector into a constant.
    forget_bias, reset_bias = _gate_vectors(bias, [directions, hidden])
    zeros = op.Constant(value=ir.tensor(np.zeros((directions, hidden, 1), dtype=np.float32)))
    columns = [
        zeros,
        op.Unsqueeze(forget_bias, op.Constant(value_ints=[2])),
        op.Unsqueeze(reset_bias, op.Constant(value_ints=[2])),
    ] + [zeros] * (k - 3)
    U = op.Add(U, op.Reshape(op.Concat(*columns, axis=2), op.Constant(value_ints=[directions * hidden * k])))
    # Reshape's 0 copies that dimension from the input: no shape arithmetic at run time.
    # With one direction the tensors have no dirs axis: c0, h and c_last then need no reshape.
    column_shape = [directions, hidden] if directions > 1 else [hidden]
    u = op.Reshape(U, op.Constant(value_ints=[0, 0, *column_shape, k]))  # (L, B, [dirs,] D, k)
    u = _time_aligned(u, directions)
    # One transpose, then each of the k blocks is a contiguous (L, B, [dirs,] D) scan input. (A Split
    # along the last axis saves the transpose but copies element by element: 1.3x slower at L=128.)
    rank = len(column_shape) + 3
    blocked = op.Transpose(u, perm=[rank - 1, *range(rank - 1)])
    blocks = [op.Gather(blocked, op.Constant(value_int=index), axis=0) for index in range(k)]
    # ([dirs,] D) each, broadcast over the batch.
    forget_weight, reset_weight = _gate_vectors(weight_c, column_shape)

    if c0 is None:
        state_shape = op.Concat(
            op.Slice(op.Shape(U), op.Constant(value_ints=[1]), op.Constant(value_ints=[2])),
            op.Constant(value_ints=column_shape),
            axis=0,
        )
        c_init = op.ConstantOfShape(state_shape, value=ir.tensor([0.0], dtype=ir.DataType.FLOAT))
    else:
        c_init = c0 if directions == 1 else op.Reshape(c0, op.Constant(value_ints=[0, *column_shape]))

    scan_inputs = [blocks[0], blocks[1]]
    pad = None
    if mask_pad is not None:
        if directions == 1:
            pad = op.Unsqueeze(mask_pad, op.Constant(value_ints=[2]))  # (L, B, 1)
        else:
            pad = op.Unsqueeze(mask_pad, op.Constant(value_ints=[2, 3]))  # (L, B, 1, 1)
            pad = _time_aligned(op.Expand(pad, op.Constant(value_ints=[1, 1, directions, 1])), directions)
        scan_inputs.append(pad)
    if reset is not None:
        scan_inputs.append(_restarts(reset, directions))
    if c_starts is not None:  # (L, B, dirs*D): the state each restarted step starts from
        starts = c_starts if directions == 1 else op.Reshape(c_starts, op.Constant(value_ints=[0, 0, *column_shape]))
        scan_inputs.append(_time_aligned(starts, directions))
    body = _cell_scan_body(
        forget_weight, masked=pad is not None, restarting=reset is not None, given_starts=c_starts is not None
    )
    c_last, c_all, c_before = _scan(c_init, scan_inputs, body)

    # The reset gate and h need only the previous step's c: all steps at once.
    reset = op.Sigmoid(op.Add(blocks[2], op.Mul(reset_weight, c_before)))
    if call.has_skip_term:
        if k == 4:
            skip = blocks[3]
        else:
            skip = (
                x
                if directions == 1
                else _time_aligned(op.Reshape(x, op.Constant(value_ints=[0, 0, *column_shape])), directions)
            )
            if isinstance(call.scale_x, (int, float)):
                if call.scale_x != 1.0:
                    skip = op.Mul(skip, op.Constant(value_float=float(call.scale_x)))
            elif call.scale_x is not None:
                skip = op.Mul(skip, _scalar(call.scale_x))
        h = op.Add(skip, op.Mul(reset, op.Sub(c_all, skip)))
    else:
        h = op.Mul(reset, c_all)
    if pad is not None:
        h = op.Where(pad, op.Constant(value_float=0.0), h)
    if directions > 1:
        h = _time_aligned(h, directions)  # the backward direction back in its own order
        h = op.Reshape(h, op.Constant(value_ints=[0, 0, directions * hidden]))
        c_last = op.Reshape(c_last, op.Constant(value_ints=[0, directions * hidden]))
    if store_c:  # the per-step states, which only a backward pass reads
        c_steps = (
            c_all
            if directions == 1
            else op.Reshape(_time_aligned(c_all, directions), op.Constant(value_ints=[0, 0, directions * hidden]))
        )
    else:
        c_steps = op.ConstantOfShape(op.Constant(value_ints=[0]), value=ir.tensor([0.0], dtype=ir.DataType.FLOAT))
    return h, c_last, c_steps


def translation_table() -> dict:
    """``custom_translation_table`` for ``torch.onnx.export(..., dynamo=True)``."""
    import torch

    from sru_lightning.ops import op as _registered  # noqa: F401  (the op must exist to be keyed on)

    return {torch.ops.sru_lightning.recurrence_forward.default: recurrence_forward}
