"""Build what third-party packages compile on first use, so no test pays for it.

`make test` runs this once per virtual environment (it leaves `.venv/.warmed`), after the install
and before the tests:

- the `sru` package (the parity peer of tests marked `peer`) compiles its C++ extension on the
  first forward pass, several minutes of one core;
- DeepSpeed's CPU accelerator compiles its shared-memory communication op when a process group
  starts (every DeepSpeed fit on the CPU);
- torch.compile's C++ back end fills its cache (headers, the compiled prelude) on the first
  compiled graph, about a minute, and would otherwise do so in whichever test compiles first,
  in several test processes at once.

Each build goes into the cache its package uses by default (TORCH_EXTENSIONS_DIR,
TORCHINDUCTOR_CACHE_DIR when set), which is where the tests look.
Each step reports its time; a step whose package is missing is skipped with the reason.
"""

from __future__ import annotations

import sys
import time
import warnings


def _sru_peer() -> str:
    import torch

    try:
        import sru
    except ImportError:
        return "skipped: the `sru` package is not installed"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sru warns about training on the CPU
        sru.SRU(4, 4)(torch.randn(3, 2, 4))
    return "built"


def _deepspeed_shared_memory_op() -> str:
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError:
        return "skipped: deepspeed is not installed"
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not builder.is_compatible(verbose=False):
        return "skipped: this accelerator has no shared-memory op to build"
    builder.load(verbose=False)
    return f"built ({builder.absolute_name()})"


def _inductor_cpp() -> str:
    import torch

    compiled = torch.compile(lambda x: (x.sin() * 2).sum(), backend="inductor")
    compiled(torch.randn(8))
    return "compiled"


STEPS = {
    "sru (parity peer) extension": _sru_peer,
    "DeepSpeed shared-memory op": _deepspeed_shared_memory_op,
    "torch.compile C++ cache": _inductor_cpp,
}


def main() -> int:
    for name, step in STEPS.items():
        started = time.perf_counter()
        outcome = step()
        print(f"warm caches: {name}: {outcome} in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
