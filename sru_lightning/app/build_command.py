"""``python -m sru_lightning build``: compile the recurrence kernels ahead of time and say
exactly what was built (CPU vector levels, CUDA architectures) and where."""

from __future__ import annotations

import torch

from sru_lightning.app.usage import CommandParser, command_prog
from sru_lightning.ops import build, build_cache, build_cuda, cpu_levels, cuda_toolkit


def _origin(compiled: bool) -> str:
    return "compiled now" if compiled else "already in the cache"


def main(argv=None) -> int:
    """``python -m sru_lightning build``: compile the kernels now and say what was built, where."""
    parser = CommandParser(
        prog=command_prog("build"),
        description="Prebuild the SRU recurrence kernels (CPU always; CUDA when torch has CUDA) into the "
        "shared extensions cache ($TORCH_EXTENSIONS_DIR or torch's default).",
    )
    parser.add_argument(
        "--cuda-arch",
        metavar="ARCHS",
        help='GPU compute capabilities to build the CUDA kernels for, e.g. "8.0;9.0" (a "+PTX" suffix adds '
        "PTX); works without a GPU, e.g. on a login node. Default: $TORCH_CUDA_ARCH_LIST, else the visible GPUs",
    )
    parser.add_argument(
        "--all-levels",
        action="store_true",
        help="build the CPU kernels for every vector level (baseline, AVX2, AVX-512) in one library, for an "
        "extensions cache shared by machines with different processors; default: the level this processor runs",
    )
    parser.add_argument("--verbose", action="store_true", help="show the compiler commands and output")
    args = parser.parse_args([] if argv is None else list(argv))
    if args.cuda_arch is not None:
        try:
            cuda_toolkit.parse_arch_list(args.cuda_arch)
        except ValueError as error:
            parser.error(str(error))
        if torch.version.cuda is None:
            parser.error(
                f"--cuda-arch: this torch ({torch.__version__}) has no CUDA, so there are no CUDA kernels to "
                "build; install a CUDA build of torch, or drop --cuda-arch to build the CPU kernels only"
            )

    cpu_spec = build.cpu_build_spec(cpu_levels.all_levels() if args.all_levels else None)
    cpu_was_cached = build.extension_loaded() or build_cache.read_manifest(cpu_spec.directory()) is not None
    if not cpu_was_cached and not args.all_levels:
        cpu_was_cached = build.find_cpu_build(cpu_levels.needed_levels()) is not None
    try:
        cpu_path = build.load_extension(verbose=args.verbose, all_levels=args.all_levels)
    except build.ExtensionBuildError as error:
        print(error)
        return 1
    from sru_lightning.ops.op import cpu_vector_level

    print(f"sru_lightning: recurrence kernels in {build_cache.cache_root()}")
    print(f"  CPU  : {cpu_path} ({_origin(not cpu_was_cached)})")
    levels = ", ".join(build.loaded_cpu_levels())
    print(f"         vector levels built: {levels}; this CPU runs: {cpu_vector_level()}")
    if torch.version.cuda is None:
        print(f"  CUDA : not built: torch {torch.__version__} has no CUDA")
        return 0
    try:
        cuda_path, archs, compiled = build_cuda.build_cuda_extension(args.cuda_arch, verbose=args.verbose)
    except build_cuda.NoCudaArchitectures as error:
        print(f"  CUDA : NOT built: {error}")
        return 0
    except build.ExtensionBuildError as error:
        print(f"  CUDA : NOT built: {error}")
        print("         the CPU kernels above are built; CUDA tensors would run the pure-PyTorch reference")
        return 1
    print(f"  CUDA : {cuda_path} ({_origin(compiled)})")
    print(f"         architectures: {', '.join(archs)} (torch CUDA {torch.version.cuda})")
    return 0
