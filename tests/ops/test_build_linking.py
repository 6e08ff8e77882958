"""The CUDA extension carries no copy of the tensor plumbing (argument checks, output
allocation): it uses the CPU library's, which is loaded with global symbols. A small probe
library built the same way checks that model on any machine."""

from __future__ import annotations

import sys
import textwrap

import pytest
from helpers import preloaded

from sru_lightning._resources import csrc_dir

PROBE_SOURCE = """
#include <torch/library.h>
#include "sru_ops.h"

// Defined in the CPU library only, as for sru_cuda.cpp.
at::Tensor probe(const at::Tensor& U) { return sru_lightning::output_tensor(U.sizes(), U.options()); }

TORCH_LIBRARY(sru_lightning_link_probe, m) { m.def("probe(Tensor U) -> Tensor", &probe); }
"""

PROBE_RUN = textwrap.dedent("""
    import sys, torch
    from torch.utils import cpp_extension
    from sru_lightning.ops import build
    if sys.argv[2] == "global":
        build.load_extension()
    else:  # the CPU library this process would use (its own or one of every level), loaded the default (local) way
        from sru_lightning.ops import cpu_levels
        library, _ = build.find_cpu_build(cpu_levels.needed_levels())
        torch.ops.load_library(library)
    cpp_extension.load(name="sru_lightning_link_probe", sources=[sys.argv[1] + "/probe.cpp"],
                       extra_include_paths=[{csrc!r}], build_directory=sys.argv[1], is_python_module=False)
    print(tuple(torch.ops.sru_lightning_link_probe.probe(torch.ones(3, 4)).shape))
""")


@pytest.mark.toolchain
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks ELF symbol resolution (Linux)")
def test_a_second_library_uses_the_cpu_librarys_plumbing(tmp_path):
    (tmp_path / "probe.cpp").write_text(PROBE_SOURCE)
    script = PROBE_RUN.format(csrc=str(csrc_dir()))

    def run(mode):
        return preloaded.run(
            [sys.executable, "-c", script, str(tmp_path), mode], capture_output=True, text=True, timeout=1200
        )

    loaded = run("global")
    assert loaded.returncode == 0 and loaded.stdout.strip().endswith("(3, 4)"), loaded.stderr[-3000:]
    # The same probe next to a CPU library loaded with local symbols cannot resolve them.
    local = run("local")
    assert local.returncode != 0 and "undefined symbol" in local.stderr, local.stderr[-3000:]
