"""`intraskill <command>`: one entry point for the project's jobs.

Commands map to library calls; each keeps its own flags (`intraskill <command> --help`).
  serve       SGLang-compatible rollout server over the embedded JAX sampler
  sim-demo    build the simulator world and play the test split with the reference policies
  sim-serve   ShopSimulator-compatible HTTP service (forwards to `python -m sim serve`)
"""

from __future__ import annotations

import sys

_SIM_COMMANDS = {"sim-demo": "demo", "sim-serve": "serve"}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] in ("-h", "--help") or argv[1] not in (*_SIM_COMMANDS, "serve"):
        print(__doc__.strip(), file=sys.stderr)
        raise SystemExit(0 if len(argv) >= 2 and argv[1] in ("-h", "--help") else 2)
    command = argv[1]
    if command == "serve":
        from intraskill_jax.rollout.serve import main as serve

        serve(argv[2:])
        return
    from absl import app

    import sim.__main__ as sim_main

    sys.argv = [f"intraskill {command}", _SIM_COMMANDS[command], *argv[2:]]
    app.run(sim_main.main, argv=sys.argv)


if __name__ == "__main__":
    main()
