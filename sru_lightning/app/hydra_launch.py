"""Run a Hydra application from a list of arguments, its errors raised to the caller.

`@hydra.main` reads its arguments from `sys.argv` and reports any error itself (a short
traceback and exit status 1; the whole error only with the environment variable
HYDRA_FULL_ERROR=1). The CLI needs neither: it has the arguments in hand, and it tells a
configuration error in one line (:mod:`.hydra_errors`) and a failed sweep with its summary. So
:func:`run_hydra` does what `hydra.main` does for one call (the same argument parser, config
search path, `--help`, `--hydra-help`, `--cfg`, `--info`, `--shell-completion`, `-m`), calling
Hydra's run machinery directly, so that whatever goes wrong comes out as the exception raised.

This is the one module that uses Hydra's private API (`hydra._internal`);
tests/app/test_hydra_launch.py checks each name it uses, so an upgrade that moves one fails
there, by name.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any

#: The private names this module uses, by module (checked by the tests).
PRIVATE_NAMES = {
    "hydra._internal.hydra": ("Hydra",),
    "hydra._internal.utils": (
        "create_automatic_config_search_path",
        "detect_calling_file_or_module_from_task_function",
        "detect_task_name",
        "get_args_parser",
    ),
    "hydra.core.utils": ("_flush_loggers",),
    "hydra.main": ("_get_rerun_conf",),
}


class FlagsConflict(ValueError):
    """Hydra's flags given together where only one may be (a usage error; the message names them)."""


def run_hydra(
    arguments: Sequence[str],
    task: Callable[[Any], Any],
    config_path: str,
    config_name: str,
    version_base: str = "1.3",
) -> None:
    """Run `task` as `@hydra.main(version_base=..., config_path=..., config_name=...)` would
    with the command line `arguments` (overrides and Hydra's flags), raising what goes wrong."""
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
        get_args_parser,
    )
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import _flush_loggers
    from hydra.errors import SearchPathException
    from hydra.main import _get_rerun_conf
    from hydra.types import RunMode

    version.setbase(version_base)
    parser = get_args_parser()
    args = parser.parse_args(list(arguments))
    if args.experimental_rerun is not None:
        task(_get_rerun_conf(args.experimental_rerun, args.overrides))
        _flush_loggers()
        return
    config_name = args.config_name or config_name
    config_path = args.config_path or config_path
    calling_file, calling_module = detect_calling_file_or_module_from_task_function(task)
    search_path = create_automatic_config_search_path(calling_file, calling_module, config_path)
    if args.config_dir is not None:
        config_dir = os.path.abspath(args.config_dir)
        if not os.path.isdir(config_dir):
            raise SearchPathException(f"Additional config directory '{config_dir}' not found")
        schema = SearchPathQuery(provider="schema")
        search_path.prepend(provider="command-line", path=f"file://{config_dir}", anchor=schema)
    hydra = Hydra.create_main_hydra2(
        task_name=detect_task_name(calling_file, calling_module), config_search_path=search_path
    )
    try:
        if args.help:
            hydra.app_help(config_name=config_name, args_parser=parser, args=args)
            sys.exit(0)
        shows_config = args.cfg is not None
        if args.resolve and not shows_config:
            raise FlagsConflict("`--resolve` must come with `--cfg` or `--help`, got neither")
        if args.hydra_help:
            hydra.hydra_help(config_name=config_name, args_parser=parser, args=args)
            sys.exit(0)
        _check_one_action(args)
        overrides = list(args.overrides)
        if shows_config:
            hydra.show_cfg(
                config_name=config_name,
                overrides=overrides,
                cfg_type=args.cfg,
                package=args.package,
                resolve=args.resolve,
            )
        elif args.shell_completion:
            hydra.shell_completion(config_name=config_name, overrides=overrides)
        elif args.info:
            hydra.show_info(args.info, config_name=config_name, overrides=overrides)
        else:
            mode = _mode(hydra.get_mode(config_name=config_name, overrides=overrides), args.multirun, overrides)
            launch = hydra.run if mode == RunMode.RUN else hydra.multirun
            launch(config_name=config_name, task_function=task, overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


def _check_one_action(args) -> None:
    """Hydra's flags that choose what the command does: at most one of them."""
    given = {
        "--run": args.run,
        "--multirun": args.multirun,
        "--cfg": args.cfg is not None,
        "--info": args.info is not None,
        "--shell-completion": args.shell_completion,
    }
    chosen = [flag for flag, on in given.items() if on]
    if len(chosen) > 1:
        raise FlagsConflict(f"only one of {', '.join(given)} may be given, got {' and '.join(chosen)}")


def _mode(configured, multirun: bool, overrides: list[str]):
    """The run mode, as Hydra decides it: `hydra.mode` from the config, `-m` making it a multirun."""
    from hydra.types import RunMode

    if configured is None:
        overrides.append("hydra.mode=MULTIRUN" if multirun else "hydra.mode=RUN")
        return RunMode.MULTIRUN if multirun else RunMode.RUN
    if multirun and configured == RunMode.RUN:
        warnings.warn(
            "\n\tRunning Hydra app with --multirun, overriding with `hydra.mode=MULTIRUN`.",
            category=UserWarning,
            stacklevel=2,
        )
        overrides.append("hydra.mode=MULTIRUN")
        return RunMode.MULTIRUN
    return configured
