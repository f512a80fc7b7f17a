"""How every command of the project reads its flags: absl flags on the command's own `FlagValues`.

Each command (`intraskill <command>`, `python -m sim`, the benchmarks) defines its flags on a fresh
`flags.FlagValues()` and hands them to `parse`, so that

* `--help` prints the command's description and its own flags (not every imported module's);
* a bad flag, a bad value or a missing required flag is one line naming the command, exit status 2
  (`usage_error`, also for the checks a command makes after parsing); errors of the work itself
  keep exit status 1;
* booleans read `--name`, `--noname` and `--name=true|false`, other flags `--name=value` or
  `--name value`, and `--flagfile=FILE` reads flags from a file, as absl does everywhere.

It lives in `sim/` because the simulator's commands use it too and `sim` never imports the trainer,
while the trainer imports `sim` (as `sim/retry.py`).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable, Sequence
from typing import NoReturn

from absl import flags

HELP = ("-h", "--help", "-help", "--helpshort", "--helpfull")


def usage_error(prog: str, message: str) -> NoReturn:
    """Stops the command `prog` on a usage error: one line on stderr, exit status 2."""
    print(f"{prog}: {message} (`{prog} --help` lists its flags)", file=sys.stderr)
    raise SystemExit(2)


def flags_help(values: flags.FlagValues) -> str:
    """Every flag of `values` with its help and default, in absl's format (without module headers)."""
    lines = values.get_help(include_special_flags=False).splitlines()
    return "\n".join(line for line in lines if line.startswith(" "))


def parse(prog: str, doc: str, define: Callable[[flags.FlagValues], None], argv: Sequence[str] | None = None,
          *, positional: Sequence[str] = ()) -> types.SimpleNamespace:
    """Reads the flags `define` declares from `argv` (the command's arguments; default `sys.argv[1:]`).

    Args:
      prog: the command as a user types it (`intraskill serve`), for help and errors.
      doc: what `--help` prints above the flags (the command's module docstring).
      define: declares the command's flags on the `FlagValues` it is given.
      argv: the arguments after the command's name.
      positional: names of the positional arguments the command takes, in order (all required).

    Returns:
      Each flag's value under its name with dashes as underscores (`--model-path`: `model_path`),
      and each positional argument under its name.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    values = flags.FlagValues()
    define(values)
    if any(a in HELP for a in argv):
        own = flags_help(values)
        usage = " ".join([prog, *(["[flags]"] if own else []), *(p.upper() for p in positional)])
        print(f"usage: {usage}\n\n{doc.strip()}" + (f"\n\nflags:\n{own}" if own else ""))
        raise SystemExit(0)
    try:
        rest = values([prog, *argv])[1:]
    except flags.Error as e:
        usage_error(prog, str(e))
    if len(rest) != len(positional):
        wanted = " ".join(p.upper() for p in positional) or "no positional arguments"
        usage_error(prog, f"takes {wanted}, got {rest}")
    # A config file's `--config.FIELD` overrides are already applied to its flag's value.
    parsed = {name.replace("-", "_"): value for name, value in values.flag_values_dict().items() if "." not in name}
    return types.SimpleNamespace(**parsed, **dict(zip(positional, rest)))
