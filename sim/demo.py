"""`python -m sim demo`: build the world, play the test split with both reference policies, report.

This is the simulator's end-to-end smoke run: it shows the pages an agent sees, one full episode,
and the success of the oracle (upper bound) and the heuristic (baseline) in the configured mode.
"""

from __future__ import annotations

import json
import time

from tqdm.auto import tqdm

from sim.config import SimConfig
from sim.env import ShopEnv
from sim.policies import HeuristicPolicy, OraclePolicy, run_episode
from sim.world import build_world


def demo(config: SimConfig, episodes: int | None = None, *, show_episode: bool = True) -> dict[str, dict[str, float]]:
    t0 = time.perf_counter()
    world = build_world(config, progress=True)
    print(f"world: {len(world.catalog):,} products, {world.index.num_terms:,} terms, "
          f"splits train/val/test = {len(world.splits.train)}/{len(world.splits.validation)}/"
          f"{len(world.splits.test)}, built in {time.perf_counter() - t0:.1f}s")
    env = ShopEnv(world)
    task_ids = [int(t) for t in world.splits.test[:episodes]]
    if show_episode and task_ids:
        _show(env, task_ids[0])
    report = {}
    for name, policy in (("oracle", OraclePolicy()), ("heuristic", HeuristicPolicy())):
        rows = [run_episode(env, policy, t) for t in tqdm(task_ids, desc=f"{name} on test", unit="ep")]
        n = max(len(rows), 1)
        report[name] = {
            "success": sum(r["reward_detail"]["success"] for r in rows) / n,
            "strict": sum(r["reward_detail"]["strict"] for r in rows) / n,
            "loose": sum(r["reward_detail"]["loose"] for r in rows) / n,
            "steps": sum(r["stats"]["steps"] for r in rows) / n,
        }
    mode = f"{config.env.mode}-turn{' + persona' if config.env.persona else ''}"
    print(f"\n{len(task_ids)} test tasks, {mode}, catalog lang={config.catalog.lang}")
    print(f"{'policy':<10} {'success':>8} {'strict':>8} {'loose':>8} {'steps':>6}")
    for name, r in report.items():
        print(f"{name:<10} {r['success']:>8.3f} {r['strict']:>8.3f} {r['loose']:>8.3f} {r['steps']:>6.1f}")
    return report


def _show(env: ShopEnv, task_id: int) -> None:
    result = env.reset(task_id)
    policy = OraclePolicy()
    policy.reset(env, result.observation)
    print(f"\n--- one oracle episode (task {task_id}) ---\nobservation: {result.observation}")
    while not result.done:
        action = policy.act(env, result.observation)
        result = env.step(action)
        print(f"action: {action}\nobservation: {result.observation[:400]}")
    print("reward detail:", json.dumps(result.info["reward_detail"]))
