"""The training-side commands: `intraskill sft | train | eval | quickstart`.

    intraskill train --config=configs/quickstart.py --workdir=runs/qs [--config.train.rounds=4 ...]
    intraskill eval  --config=configs/quickstart.py --workdir=runs/qs [--conditions=base_bare,trained_skill]
    intraskill quickstart [--workdir=runs/quickstart]      # train, evaluate and build the report
    intraskill rank --config=... --workdir=runs/qs --k=3    # top-k / bottom-k / random-k chunk subsets
    intraskill multiseed --config=... --workdir=runs/ms --seeds=0,1,2   # train + eval per seed, pooled

Configs are ml-collections files; every field can be overridden with --config.<path>=value. A
resumed run (same --workdir) continues from its last checkpoint; its config must not change.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import logging
import math
import re
import types
from collections.abc import Sequence
from pathlib import Path

from absl import flags
from etils import epath
from ml_collections import config_flags

from sim import flagparse

from intraskill_jax import allocator, runconfig
from intraskill_jax.progress import LOG_DATE_FORMAT, LOG_FORMAT, Planned, Progress

QUICKSTART = str(Path(__file__).resolve().parent.parent / "configs" / "quickstart.py")


def _define_flags(values: flags.FlagValues, argv: Sequence[str]) -> None:
    # config_flags defines the --config.FIELD override flags it finds in `argv`.
    config_flags.DEFINE_config_file("config", None, "ml-collections config file (configs/*.py)", flag_values=values,
                                    sys_argv=list(argv))
    flags.DEFINE_string("workdir", None, "run directory (checkpoints, metrics, skills, eval, report)",
                        flag_values=values)
    flags.DEFINE_list("conditions", None, "eval conditions: names (base_bare, base_skill, trained_bare, "
                      "trained_skill) or name=POLICY:SKILL with POLICY base|trained|DIR and SKILL "
                      "none|initial|final|DIR", flag_values=values)
    flags.DEFINE_bool("quiet", False, "no progress bars", flag_values=values)
    flags.DEFINE_integer("k", 3, "rank: chunks per subset (top-k, bottom-k, random-k)", flag_values=values)
    flags.DEFINE_list("seeds", ["0", "1", "2"], "multiseed: training seeds (one run each, under --workdir)",
                      flag_values=values)


def job_plan(config: runconfig.RunConfig, command: str, conditions: Sequence[str] | None = None) -> list[Planned]:
    """The stages `command` runs, with prior costs: work and compiling seconds measured for
    configs/quickstart.py on two CPU cores (an AMD EPYC, 2026-12-06), the work scaled by each stage's
    size. The display rescales the work by the speed it observes and the compiling by how the
    finished stages' compiling compared, and replaces a running stage's prior work with its own
    rate. The stages that play episodes are one kind: on a larger model their cost grows unlike the
    warm start's (docs/performance.md: the SmolLM2 run's ETA). The evaluation is a stage per
    condition (`conditions`' names, default `eval.conditions`), each timed at its own rate once it
    runs."""
    ws, t, sk = config.warm_start, config.train, config.skills
    episode = 0.04  # work seconds per evaluation episode at the quickstart's size
    updates = math.ceil(0.7 * ws.num_demos / ws.sft.batch_size) * ws.sft.epochs  # ~70% of oracle runs succeed
    arms = 3 if sk.gate.full_arm else 2
    train = [Planned("setup", 1, per_unit=12.0),
             Planned("sft", updates if ws.enabled else 0, per_unit=0.075 * ws.sft.batch_size, startup=37.0),
             Planned("co-evolution", t.steps, per_unit=0.21 * t.groups_per_step * t.group_size, startup=180.0,
                     kind="episodes"),
             Planned("gate", t.rounds if sk.mode == "coevolve" else 0, per_unit=0.065 * arms * sk.validation_tasks,
                     startup=10.0, kind="episodes")]
    evaluation = []
    if command in ("eval", "rank", "multiseed", "quickstart"):
        from intraskill_jax.evaluate import evaluation_stage

        names = list(conditions or config.eval.conditions)
        evaluation = [Planned(evaluation_stage(name), config.eval.num_tasks, per_unit=episode,
                              startup=5.0 / len(names), kind=("evaluation", "episodes")) for name in names]
    report = [Planned("report", 5, per_unit=2.5, scales=False)]  # ~9 s for the SmolLM2 run as for the quickstart
    return {"sft": train[:2], "train": train, "eval": evaluation, "rank": evaluation, "multiseed": train + evaluation,
            "quickstart": train + evaluation + report}[command]


def _setup(command: str, args: types.SimpleNamespace):
    from intraskill_jax import distributed

    prog = f"intraskill {command}"
    if command != "quickstart" and args.config is None:
        flagparse.usage_error(prog, "--config is required (e.g. --config=configs/quickstart.py)")
    if command != "quickstart" and not args.workdir:
        flagparse.usage_error(prog, "--workdir is required")
    distributed.maybe_initialize()
    try:
        config = runconfig.load(args.config) if args.config is not None else runconfig.load_file(QUICKSTART)
    except runconfig.ConfigError as e:
        raise SystemExit(f"{prog}: {e}") from None
    from intraskill_jax import rundir

    try:
        workdir = rundir.run_path(args.workdir or f"runs/{config.name}")
    except (ValueError, ImportError) as e:
        flagparse.usage_error(prog, f"--workdir: {e}")
    if distributed.is_multiprocess() and config.rollout.engine == "jax" and config.sim.shopper.backend == "openai":
        # Every process plays the embedded sampler's episodes; each would ask the LLM shopper itself
        # and see other replies, so the processes would feed the global programs different inputs.
        raise SystemExit(f"{prog}: on several processes the LLM shopper (sim.shopper.backend=openai) needs "
                         "rollout.engine=sglang (process 0 plays the episodes); or set sim.shopper.backend=rule")
    conditions = None
    if command == "rank" or (command in ("eval", "quickstart") and args.conditions):
        from intraskill_jax.evaluate import parse_condition, ranking_names

        try:
            conditions = (ranking_names(args.k) if command == "rank"
                          else [parse_condition(c).name for c in args.conditions])
        except ValueError as e:
            flagparse.usage_error(prog, f"--{'k' if command == 'rank' else 'conditions'}: {e}")
    # One display: the other processes run the same stages in lockstep.
    return config, workdir, Progress(job_plan(config, command, conditions),
                                     enabled=not args.quiet and distributed.is_main_process())


def _train(config, workdir, progress):
    from intraskill_jax import rundir
    from intraskill_jax.coevolve import Coevolution

    run = Coevolution.start(config, workdir, progress=progress)
    try:
        bank = run.run()
    finally:
        run.close()
        del run  # the loop's model, optimizer state and sampler cache go before the evaluation's come
        allocator.release_free_memory()
    progress.write(f"trained policy: {rundir.final_policy_dir(workdir)}; final skill: {bank.name} ({len(bank.active)} chunks)")


def _eval(config, workdir, progress, names):
    from intraskill_jax.evaluate import evaluate, parse_condition

    conditions = [parse_condition(c) for c in names] if names else None
    evaluate(config, workdir, conditions, progress=progress)


def _summary(workdir, figures=None):
    """The run's front page, from its figures (computed from the run directory when not given)."""
    from intraskill_jax.analysis.summary import format_figures, format_summary

    print("\n" + (format_summary(workdir) if figures is None else format_figures(figures, workdir)))


def _rank(config, workdir, progress, k):
    from intraskill_jax import rundir
    from intraskill_jax.analysis.results import condition_table, format_condition_table
    from intraskill_jax.evaluate import evaluate, ranking_conditions, skill_bank

    bank = skill_bank(config, workdir, "final")
    rows = evaluate(config, workdir, ranking_conditions(bank, k, config.eval.seed), progress=progress,
                    out=rundir.ranking_outcomes_path(workdir))
    progress.write(format_condition_table(condition_table(rows)))


def _multiseed(config, workdir, progress, seeds):
    """Trains and evaluates one run per seed (`<workdir>/seed_<s>/`) and pools the conditions."""
    import numpy as np

    from intraskill_jax import rundir
    from intraskill_jax.analysis.results import condition_table
    from intraskill_jax.evaluate import evaluate

    per_seed = {}
    for seed in (int(s) for s in seeds):
        cfg = dataclasses.replace(config, train=dataclasses.replace(config.train, seed=seed))
        out = rundir.seed_run_dir(workdir, seed)
        with Progress(job_plan(cfg, "multiseed"), enabled=progress.enabled) as seed_progress:  # one display per seed
            _train(cfg, out, seed_progress)
            rows = evaluate(cfg, out, progress=seed_progress)
        per_seed[seed] = {r["condition"]: r for r in condition_table(rows)}
    pooled = {}
    for cond in sorted({c for table in per_seed.values() for c in table}):
        values = np.array([table[cond]["success"] for table in per_seed.values() if cond in table])
        pooled[cond] = {"seeds": len(values), "success_mean": float(values.mean()),
                        "success_sd": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                        "per_seed": values.tolist()}
        print(f"{cond:16s} success {values.mean():.3f} +- {pooled[cond]['success_sd']:.3f} over {len(values)} seeds")
    rundir.write_json(rundir.multiseed_path(workdir), {"seeds": list(per_seed), "conditions": pooled})


def main(command: str, args: types.SimpleNamespace) -> None:
    config, workdir, progress = _setup(command, args)
    # What absl's app.run gave these commands: a Python stack on a crash inside native code, and
    # a handler for the libraries' warnings (ours print above the progress bar).
    faulthandler.enable()
    logging.basicConfig(format=LOG_FORMAT, datefmt=LOG_DATE_FORMAT)
    with progress, progress.logging_to_bar("intraskill_jax", "sim"):
        _command(command, args, config, workdir, progress)
    if command == "eval":
        _summary(workdir)


def _command(command: str, args: types.SimpleNamespace, config: runconfig.RunConfig, workdir: epath.Path,
             progress: Progress) -> None:
    # Our progress lines at INFO; library chatter (orbax, absl, jax) only from WARNING up.
    logging.getLogger().setLevel(logging.WARNING)
    for name in ("intraskill_jax", "sim"):
        logging.getLogger(name).setLevel(logging.INFO)
    logging.getLogger(__name__).info(allocator.describe())
    if command == "sft":
        from sim.world import build_world

        from intraskill_jax.policy import default_mesh, prepare_policy
        from intraskill_jax.warm_start import warm_start

        with progress.stage("setup", 1) as bar:
            world = build_world(config.sim)
            base = prepare_policy(config, workdir, world)
            bar.update()
        out = warm_start(config.for_policy(base), workdir, base, world, progress=progress, mesh=default_mesh(config))
        progress.close()
        print(out)
    elif command == "train":
        _train(config, workdir, progress)
    elif command == "eval":
        _eval(config, workdir, progress, args.conditions)
    elif command == "rank":
        _rank(config, workdir, progress, args.k)
    elif command == "multiseed":
        _multiseed(config, workdir, progress, args.seeds)
    elif command == "quickstart":
        from intraskill_jax.analysis.report import build_report, print_report

        _train(config, workdir, progress)
        _eval(config, workdir, progress, args.conditions)
        report = build_report(workdir, progress=progress)
        progress.close()
        print_report(report, workdir)
        _summary(workdir, report.figures)
    else:
        flagparse.usage_error(f"intraskill {command}", "unknown command")


_SECTIONS = ", ".join(f.name for f in dataclasses.fields(runconfig.RunConfig) if f.name != "name")
QUICKSTART_USAGE = f"""\
usage: intraskill quickstart [--workdir=DIR] [--quiet] [--config.FIELD=VALUE ...]

Train, evaluate and report in one command on the CPU default: a tiny Qwen3.5-architecture policy,
SFT warm start, co-evolution rounds with the skill bank and the gate, the four test conditions,
then the report; it ends with a summary of the run. A rerun with the same --workdir resumes.

flags:
  --workdir=DIR           run directory (default: runs/quickstart)
  --quiet                 no progress bars
  --config.FIELD=VALUE    override one field of configs/quickstart.py, e.g.
                            --config.train.rounds=4 --config.train.gate_every=20
                            --config.eval.num_tasks=50 --config.sim.env.reward=strict
                          sections: {_SECTIONS}
                          (every field: configs/quickstart.py and intraskill_jax/runconfig.py)
  --config=FILE           start from another config file instead of configs/quickstart.py
  --conditions=A,B        evaluate only these conditions (as `intraskill eval`)

config file: {QUICKSTART}
"""


def _quickstart_args(args: list[str]) -> list[str]:
    """Makes `--config.FIELD=VALUE` work without `--config=FILE`: absl only knows the override
    flags of a config file it was given."""
    if any(a == "--config" or a.startswith("--config=") for a in args):
        return args
    return [f"--config={QUICKSTART}", *args]


_OVERRIDE = re.compile(r"^--?(?:no)?config\.([^=]+)")


def check_overrides(args: list[str]) -> None:
    """Reads the `--config=FILE[:preset]` of `args` and checks the keys of its `--config.KEY=VALUE`
    overrides. absl reads the file and applies them while it parses flags, where a missing file, an
    unknown preset or key (a misspelling) end in a traceback; here each is one ConfigError, an
    unknown key with its nearest keys."""
    keys = [m.group(1) for m in map(_OVERRIDE.match, args) if m]
    path = None
    for i, arg in enumerate(args):  # absl's forms: --config=FILE, --config FILE (the last one counts)
        flag, eq, value = arg.lstrip("-").partition("=")
        if arg.startswith("-") and flag == "config":
            path = value if eq else (args[i + 1] if i + 1 < len(args) else None)
    if path:
        runconfig.check_keys(runconfig.read_file(path), keys)


def run(command: str, args: list[str]) -> None:
    prog = f"intraskill {command}"
    if command == "quickstart":
        if any(a in flagparse.HELP for a in args):
            print(QUICKSTART_USAGE, end="")
            raise SystemExit(0)
        args = _quickstart_args(args)
    try:
        check_overrides(args)
    except runconfig.ConfigError as e:
        raise SystemExit(f"{prog}: {e}") from None
    main(command, flagparse.parse(prog, __doc__, lambda values: _define_flags(values, [prog, *args]), args))
