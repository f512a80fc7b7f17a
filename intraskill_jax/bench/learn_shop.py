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

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

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
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--config", default=str(DEFAULT_CONFIG), help="config file (default configs/shop_h200.py)")
    parser.add_argument("--workdir", default="runs/shop_h200", help="run directory")
    parser.add_argument("--progress", action="store_true", help="progress bars on stderr")
    args = parser.parse_args(argv)
    result = run(args.config, args.workdir, progress=args.progress)
    print(json.dumps(result, sort_keys=True) if args.json else json.dumps(result, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
