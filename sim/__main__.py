"""The simulator's command line: `python -m sim <command> [--config=configs/sim.py] [--config.x.y=v ...]`.

Commands:
  demo    build the world and play the test split with the oracle and heuristic policies
  serve   ShopSimulator-compatible HTTP service on server.host:server.port (see sim/server.py)

The config is an ml-collections file with `get_config()`; any field can be overridden on the
command line, e.g. `python -m sim serve --config.server.port=5001 --config.catalog.lang=zh`.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable, Sequence

from absl import flags
from ml_collections import config_flags

from sim import flagparse
from sim.config import ConfigError, SimConfig

_DEFAULT_CONFIG = pathlib.Path(__file__).resolve().parent.parent / "configs" / "sim.py"


def _define_flags(values: flags.FlagValues, argv: Sequence[str]) -> None:
    # config_flags defines the --config.FIELD override flags it finds in `argv`.
    config_flags.DEFINE_config_file(
        "config",
        default=str(_DEFAULT_CONFIG) if _DEFAULT_CONFIG.exists() else None,
        help_string="ml-collections file with get_config() returning the sim.config.SimConfig fields.",
        lock_config=True,
        flag_values=values,
        sys_argv=list(argv),
    )
    flags.DEFINE_integer("episodes", None, "demo: number of test tasks to play (default: the whole split)",
                         flag_values=values)


def _serve(config: SimConfig, episodes: int | None) -> None:
    from sim.server import serve

    serve(config)


def _demo(config: SimConfig, episodes: int | None) -> None:
    from sim.demo import demo

    demo(config, episodes)


COMMANDS: dict[str, Callable[[SimConfig, int | None], None]] = {
    "demo": _demo,
    "serve": _serve,
}


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m sim") -> None:
    """`argv`: the command (demo|serve) and its flags; `prog`: how the user called it."""
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = flagparse.parse(prog, __doc__, lambda values: _define_flags(values, [prog, *argv]), argv,
                           positional=("command",))
    if args.command not in COMMANDS:
        flagparse.usage_error(prog, f"the command is one of {', '.join(COMMANDS)}; got {args.command!r}")
    if args.config is None:
        flagparse.usage_error(prog, "no config: pass --config=configs/sim.py (an ml-collections file with get_config())")
    try:
        config = SimConfig.from_mapping(args.config)
    except (ConfigError, TypeError) as e:
        raise SystemExit(f"{prog}: bad simulator config: {e}") from None
    COMMANDS[args.command](config, args.episodes)


if __name__ == "__main__":
    main()
