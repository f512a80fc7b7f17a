"""`intraskill <command>`: one entry point for the project's jobs.

Commands map to library calls; each keeps its own flags (`intraskill <command> --help`).
  quickstart    train, evaluate and report on the CPU default (configs/quickstart.py)
  sft           supervised warm start on oracle demonstrations (--config, --workdir)
  train         co-evolution: GRPO rounds with the skill bank, masks and the gate (--config, --workdir)
  eval          the four test conditions on the same tasks (--config, --workdir, --conditions)
  rank          the ranking appendix: top-k, bottom-k and random-k chunk subsets (--k)
  multiseed     train and evaluate one run per seed and pool them (--seeds)
  report        plots, bundle and the static site from a run directory (--workdir)
  check-bundle  verify a bundle's hashes and recompute its figures (DIR)
  compile-check will a config fit a TPU slice: compile its programs ahead of time (--config, --topology)
  serve         SGLang-compatible rollout server over the embedded JAX sampler
  fetch-model   download and convert a pretrained checkpoint once, print its HF directory (NAME)
  sim-demo      build the simulator world and play the test split with the reference policies
  sim-serve     ShopSimulator-compatible HTTP service (forwards to `python -m sim serve`)
"""

from __future__ import annotations

import sys

_SIM_COMMANDS = {"sim-demo": "demo", "sim-serve": "serve"}
_TRAINING = ("quickstart", "sft", "train", "eval", "rank", "multiseed")
_COMMANDS = (*_TRAINING, "report", "check-bundle", "compile-check", "serve", "fetch-model", *_SIM_COMMANDS)


def main(argv: list[str] | None = None) -> None:
    if argv is None:  # the program itself (not a caller's in-process call): pick the allocator first
        from intraskill_jax import allocator

        allocator.ensure()
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] in ("-h", "--help") or argv[1] not in _COMMANDS:
        print(__doc__.strip(), file=sys.stderr)
        raise SystemExit(0 if len(argv) >= 2 and argv[1] in ("-h", "--help") else 2)
    command, rest = argv[1], argv[2:]
    if command in _TRAINING:
        from intraskill_jax.main import run

        run(command, rest)
    elif command == "report":
        from intraskill_jax.analysis.report import main as report

        report(rest)
    elif command == "check-bundle":
        from intraskill_jax.analysis.bundle import main as check_bundle

        check_bundle(rest)
    elif command == "compile-check":
        from intraskill_jax.compile_check import main as compile_check

        compile_check(rest)
    elif command == "serve":
        from intraskill_jax.rollout.serve import main as serve

        serve(rest)
    elif command == "fetch-model":
        from intraskill_jax.models.acquire import main as fetch_model

        fetch_model(rest)
    else:
        import sim.__main__ as sim_main

        sim_main.main([_SIM_COMMANDS[command], *rest], prog=f"intraskill {command}")


if __name__ == "__main__":
    main()
