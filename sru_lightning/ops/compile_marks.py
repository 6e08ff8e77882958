"""Marks for torch.compile that do not import the compiler.

``torch.compiler.assume_constant_result`` imports ``torch._dynamo`` (about four seconds) to set
one attribute on the function, which Dynamo reads when it traces a call. The layers mark their
functions at import, and a user of the layers who never compiles should pay for torch only, so
the mark is set here directly; ``tests/ops/test_compile_marks.py`` checks that it is what
torch's decorator sets, so a torch release that changes it fails there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

# The attribute torch._dynamo.assume_constant_result sets (torch 2.13).
CONSTANT_RESULT_ATTRIBUTE = "_dynamo_marked_constant"


def assume_constant_result(fn: F) -> F:
    """``torch.compiler.assume_constant_result(fn)`` without importing ``torch._dynamo``: under
    torch.compile the result is computed once while tracing and baked into the graph."""
    setattr(fn, CONSTANT_RESULT_ATTRIBUTE, True)
    return fn
