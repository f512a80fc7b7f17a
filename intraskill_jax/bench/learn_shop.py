"""Does the method learn the shop? One whole run, its headline as JSON.

    python -m intraskill_jax.bench.learn_shop --json                        # configs/shop_h200.py
    python -m intraskill_jax.bench.learn_shop --json --config=configs/quickstart.py --workdir=/tmp/qs

Runs the main job (warm start, co-evolution rounds, the four test conditions, the report) on a
config and prints what it is judged by: the warm start's (base) and the trained policy's success
and reward with and without the skill, the paired differences with their 95% intervals, the
training funnel, and the wall time of each stage, with the device and the load averages. A rerun
in the same workdir resumes and only re-reads what is done.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from absl import flags

from sim import flagparse

from intraskill_jax import allocator

REPO = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = REPO / "configs" / "shop_h200.py"


def run(config_path: str | Path, workdir: str | Path, *, progress: bool = False) -> dict[str, Any]:
    import jax

    from intraskill_jax import runconfig
    from intraskill_jax.analysis.report import build_report
    from intraskill_jax.coevolve import Coevolution
    from intraskill_jax.evaluate import evaluate

    config = runconfig.load_file(config_path)
    workdir = Path(workdir)
    seconds: dict[str, float] = {}
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    train = Coevolution.start(config, workdir, progress=progress)
    seconds["warm_start"] = time.perf_counter() - t0  # built by the constructor (resumed if done)
    try:
        t = time.perf_counter()
        train.run()
        seconds["coevolution"] = time.perf_counter() - t
    finally:
        train.close()
    t = time.perf_counter()
    evaluate(config, workdir, progress=progress)
    seconds["evaluation"] = time.perf_counter() - t
    t = time.perf_counter()
    figures = build_report(workdir, progress=progress).figures
    seconds["report"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    pairs = {f"{c['a']}_vs_{c['b']}": {k: c[k] for k in c if k not in ("a", "b")} for c in figures["comparisons"]}
    return {
        "config": str(config_path), "workdir": str(workdir), "name": config.name,
        "device": f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind} x{jax.device_count()}",
        "conditions": {r["condition"]: {k: r[k] for k in ("n", "reward", "strict", "success")}
                       for r in figures["conditions"]},
        "comparisons": pairs,
        "training_funnel": figures["training_funnel"],
        "rounds": figures["rounds"],
        "seconds": seconds,
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "allocator": allocator.active(),
    }


def _define_flags(values: flags.FlagValues) -> None:
    flags.DEFINE_bool("json", False, "print one JSON object", flag_values=values)
    flags.DEFINE_string("config", str(DEFAULT_CONFIG), "config file", flag_values=values)
    flags.DEFINE_string("workdir", "runs/shop_h200", "run directory", flag_values=values)
    flags.DEFINE_bool("progress", False, "progress bars on stderr", flag_values=values)


def main(argv: Sequence[str] | None = None) -> None:
    if argv is None:  # run as a program: the allocator users get (intraskill_jax/allocator.py)
        allocator.ensure()
    args = flagparse.parse("python -m intraskill_jax.bench.learn_shop", __doc__, _define_flags, argv)
    result = run(args.config, args.workdir, progress=args.progress)
    print(json.dumps(result, sort_keys=True) if args.json else json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
