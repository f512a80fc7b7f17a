"""The simulator's command line: `python -m sim <command> [--config=configs/sim.py] [--config.x.y=v ...]`.

Commands:
  demo    build the world and play the test split with the oracle and heuristic policies
  serve   ShopSimulator-compatible HTTP service on server.host:server.port (see sim/server.py)

The config is an ml-collections file with `get_config()`; any field can be overridden on the
command line, e.g. `python -m sim serve --config.server.port=5001 --config.catalog.lang=zh`.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable

from absl import app, flags
from ml_collections import config_flags

from sim.config import ConfigError, SimConfig

_DEFAULT_CONFIG = pathlib.Path(__file__).resolve().parent.parent / "configs" / "sim.py"

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    default=str(_DEFAULT_CONFIG) if _DEFAULT_CONFIG.exists() else None,
    help_string="ml-collections file with get_config() returning the sim.config.SimConfig fields.",
    lock_config=True,
)


def _serve(config: SimConfig) -> None:
    from sim.server import serve

    serve(config)


def _demo(config: SimConfig) -> None:
    from sim.demo import demo

    demo(config, _EPISODES.value)


_EPISODES = flags.DEFINE_integer("episodes", None, "demo: number of test tasks to play (default: the whole split)")

COMMANDS: dict[str, Callable[[SimConfig], None]] = {
    "demo": _demo,
    "serve": _serve,
}


def _load_config() -> SimConfig:
    if _CONFIG.value is None:
        raise app.UsageError("no config: pass --config=configs/sim.py (an ml-collections file with get_config())")
    try:
        return SimConfig.from_mapping(_CONFIG.value)
    except (ConfigError, TypeError) as e:
        raise app.UsageError(f"bad simulator config: {e}") from None


def main(argv: list[str]) -> None:
    names = "|".join(COMMANDS)
    if len(argv) != 2 or argv[1] not in COMMANDS:
        got = " ".join(argv[1:]) or "nothing"
        raise app.UsageError(f"usage: python -m sim {{{names}}} [--config=configs/sim.py]; got {got}")
    COMMANDS[argv[1]](_load_config())


if __name__ == "__main__":
    app.run(main)
