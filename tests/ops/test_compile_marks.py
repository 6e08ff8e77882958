"""The compile marks the layers set without importing torch._dynamo are the ones torch sets."""

from __future__ import annotations

import torch

from sru_lightning.ops import compile_marks, functional


def test_the_constant_result_mark_is_the_one_torch_sets():
    def plain():
        return True

    def marked_by_torch():
        return True

    torch.compiler.assume_constant_result(marked_by_torch)
    added_by_torch = set(vars(marked_by_torch)) - set(vars(plain))
    assert added_by_torch == {compile_marks.CONSTANT_RESULT_ATTRIBUTE}, (
        f"torch.compiler.assume_constant_result now sets {sorted(added_by_torch)}; "
        "update sru_lightning/ops/compile_marks.py"
    )
    assert compile_marks.assume_constant_result(plain) is plain
    assert vars(plain) == vars(marked_by_torch)
    assert getattr(functional._cpp_backend_ready, compile_marks.CONSTANT_RESULT_ATTRIBUTE) is True


def test_compiled_calls_bake_the_backend_check_into_the_graph():
    # Compiled with fullgraph: a call Dynamo had to trace into (the build's lock) would break the graph.
    from sru_lightning.nn import SRU

    layer = SRU(8, 8)
    x = torch.randn(5, 2, 8)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x)[0], layer(x)[0])
