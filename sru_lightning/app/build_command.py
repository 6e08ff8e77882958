"""``python -m sru_lightning build``: compile the recurrence kernels ahead of time and say
exactly what was built (CPU vector levels, CUDA architectures) and where."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sru_lightning.app.key_value import command_usage, read_settings, setting, wants_help
from sru_lightning.app.usage import UsageError, command_prog, print_error
from sru_lightning.ops import build, build_cache, build_cuda, cpu_levels, cuda_toolkit

PROG = command_prog("build")


@dataclass
class BuildSettings:
    """The command's settings (`key=value` on the command line)."""

    cuda_arch: str = setting(
        "",
        'GPU compute capabilities to build the CUDA kernels for, e.g. "8.0;9.0" (a "+PTX" suffix adds PTX); works '
        "without a GPU, e.g. on a login node; empty: $TORCH_CUDA_ARCH_LIST, else the visible GPUs",
    )
    all_levels: bool = setting(
        False,
        "build the CPU kernels for every vector level (baseline, AVX2, AVX-512) in one library, for an extensions "
        "cache shared by machines with different processors; false: the level this processor runs",
    )
    verbose: bool = setting(False, "show the compiler commands and output")


def usage() -> str:
    purpose = (
        "Prebuild the SRU recurrence kernels (CPU always; CUDA when torch has CUDA) into the shared extensions "
        "cache ($TORCH_EXTENSIONS_DIR or torch's default)."
    )
    examples = [f"{PROG} all_levels=true", f"{PROG} cuda_arch='8.0;9.0'"]
    return command_usage(PROG, purpose, BuildSettings, examples=examples)


def parse_settings(argv) -> BuildSettings:
    """`key=value` arguments (or the old `--flag` spellings) -> checked settings; raises UsageError."""
    settings, _ = read_settings(argv, BuildSettings, UsageError, old_flags=True)
    if settings.cuda_arch:
        try:
            cuda_toolkit.parse_arch_list(settings.cuda_arch)
        except ValueError as error:
            raise UsageError(str(error)) from None
    return settings


def check_cuda_wanted(settings: BuildSettings) -> None:
    """CUDA architectures asked of a torch without CUDA: a usage error (raises UsageError)."""
    if settings.cuda_arch and torch.version.cuda is None:
        raise UsageError(
            f"`cuda_arch`: this torch ({torch.__version__}) has no CUDA, so there are no CUDA kernels to "
            "build; install a CUDA build of torch, or drop cuda_arch to build the CPU kernels only"
        )


def _origin(compiled: bool) -> str:
    return "compiled now" if compiled else "already in the cache"


def main(argv=None) -> int:
    """``python -m sru_lightning build``: compile the kernels now and say what was built, where."""
    argv = [] if argv is None else list(argv)
    if wants_help(argv):
        print(usage())
        return 0
    try:
        args = parse_settings(argv)
        check_cuda_wanted(args)
    except UsageError as error:
        print_error(str(error), PROG)
        return 2

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
        cuda_path, archs, compiled = build_cuda.build_cuda_extension(args.cuda_arch or None, verbose=args.verbose)
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
