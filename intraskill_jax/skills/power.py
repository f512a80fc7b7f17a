"""How often the gate keeps helpful chunks and drops harmful ones: a simulation with known effects.

Each replicate draws a task difficulty q_i ~ U(base_low, base_high) and a task draw U_i ~ U(0, 1)
per validation task, runs the real `run_gate` with an `evaluate` that plays Bernoulli outcomes
(bare: q_i; with mask C_i: q_i + C_i^T beta, clipped to [0, 1]), and records which chunks
survive. An episode succeeds when its uniform falls below its probability; with probability
`coupling` that uniform is the task's own U_i, shared by the arms, which makes the paired outcomes
correlated as reruns of one task are (about 30% discordance by default, the reference's example).
The statistics predict

    P(retain_j) = Phi(beta_j / SE_j)                 rule 'positive'
    P(retain_j) = Phi(beta_j / SE_j - z_{1-a/2})     rule 'significant'

with SE_j^2 = c_K sigma^2 / n, c_K = 1 / (p(1-p)) * (1 - p^2 / (p(1-p) + K p^2)) (4K/(K+1) at
p = 0.5) and sigma^2 = Var(R_i - B_i - C_i^T beta), computed here by Monte Carlo.

    python -m intraskill_jax.skills.power --json [--replicates 400 --n-tasks 200]
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np
from absl import flags
from scipy import stats as sps

from sim import flagparse

from intraskill_jax.agent.episode import SkillContext
from intraskill_jax.skills.bank import Chunk, SkillBank
from intraskill_jax.skills.gate import GateConfig, Outcome, decide, run_gate

DEFAULT_BETAS = (0.12, 0.10, 0.08, 0.06, 0.0, 0.0, -0.06, -0.08, -0.10, -0.12)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PowerConfig:
    betas: tuple[float, ...] = DEFAULT_BETAS
    n_tasks: int = 200
    replicates: int = 400
    base_low: float = 0.36
    base_high: float = 0.60
    coupling: float = 0.7
    inclusion: float = 0.5
    alpha: float = 0.05
    seed: int = 0


def synthetic_bank(k: int) -> SkillBank:
    chunks = tuple(
        Chunk(f"chunk-{j}", f"Synthetic procedure {j}.", f"合成步骤 {j}。", title=f"chunk {j}")
        for j in range(k)
    )
    return SkillBank("s0", "Synthetic chunks for the gate power simulation.", chunks)


def bernoulli_evaluate(
    betas: np.ndarray,
    difficulty: np.ndarray,
    task_draw: np.ndarray,
    coupling: float,
    rng: np.random.Generator,
):
    """An `evaluate` whose success probability is difficulty[task] + mask . betas (mask from the context)."""

    def evaluate(task_ids: Sequence[int], contexts: Sequence[SkillContext]) -> list[Outcome]:
        masks = np.asarray([c.skill_mask for c in contexts], np.float64)
        tasks = np.asarray(task_ids)
        prob = np.clip(difficulty[tasks] + masks @ betas, 0.0, 1.0)
        u = np.where(rng.random(prob.shape) < coupling, task_draw[tasks], rng.random(prob.shape))
        return [Outcome(float(ok), bool(ok)) for ok in u < prob]  # reward 1 exactly when it succeeds

    return evaluate


def predicted_se(config: PowerConfig, draws: int = 400_000) -> tuple[float, float, float]:
    """(sigma, SE_j, discordance) of the design, sigma^2 = Var(R - B - C.beta) by Monte Carlo."""
    rng = np.random.default_rng(12345)
    k, p = len(config.betas), config.inclusion
    q = rng.uniform(config.base_low, config.base_high, draws)
    effect = (rng.random((draws, k)) < p) @ np.asarray(config.betas)
    pr = np.clip(q + effect, 0.0, 1.0)
    shared = rng.random(draws)
    ub = np.where(rng.random(draws) < config.coupling, shared, rng.random(draws))
    ur = np.where(rng.random(draws) < config.coupling, shared, rng.random(draws))
    b, r = (ub < q).astype(float), (ur < pr).astype(float)
    sigma2 = float(np.var(r - b - effect))
    discordance = float(np.mean(r != b))
    a, b = p - p * p, p * p
    c_k = (1 / a) * (1 - b / (a + k * b))
    return float(np.sqrt(sigma2)), float(np.sqrt(c_k * sigma2 / config.n_tasks)), discordance


def simulate(
    config: PowerConfig = PowerConfig(), rules: Sequence[str] = ("positive", "significant")
) -> dict:
    """Runs the replicates; returns predicted and measured retention per chunk and per class."""
    betas = np.asarray(config.betas, np.float64)
    k = betas.size
    bank = synthetic_bank(k)
    rng = np.random.default_rng(config.seed)
    gate_configs = {
        r: GateConfig(rule=r, inclusion=config.inclusion, alpha=config.alpha, bootstrap_resamples=0)
        for r in rules
    }
    retained = {r: np.zeros((config.replicates, k), bool) for r in rules}
    ses = np.zeros((config.replicates, k))
    additivity_ok = 0
    tasks = list(range(config.n_tasks))
    for rep in range(config.replicates):
        difficulty = rng.uniform(config.base_low, config.base_high, config.n_tasks)
        evaluate = bernoulli_evaluate(
            betas, difficulty, rng.random(config.n_tasks), config.coupling, rng
        )
        first, *others = rules
        result = run_gate(evaluate, bank, [], tasks, rng, config=gate_configs[first])
        banks = {first: result.bank}
        for r in others:
            banks[r], _ = decide(bank, [], result.contributions, gate_configs[r])
        for r in rules:
            active = set(banks[r].active_ids)
            retained[r][rep] = [c.id in active for c in bank.active]
        ses[rep] = result.contributions.se
        additivity_ok += bool(result.additivity is not None and result.additivity.consistent)

    sigma, se, discordance = predicted_se(config)
    z = sps.norm.ppf(1 - config.alpha / 2)
    out = {
        "config": dataclasses.asdict(config),
        "sigma": sigma,
        "discordance": discordance,
        "predicted_se": se,
        "measured_se_mean": float(ses.mean()),
        "additivity_consistent_rate": additivity_ok / config.replicates,
        "rules": {},
    }
    for r in rules:
        shift = 0.0 if r == "positive" else z
        pred = sps.norm.cdf(betas / se - shift)
        meas = retained[r].mean(axis=0)
        per_chunk = [
            {
                "beta": float(b),
                "predicted_retain": float(pp),
                "measured_retain": float(m),
                "mc_se": float(np.sqrt(max(pp * (1 - pp), 1e-12) / config.replicates)),
            }
            for b, pp, m in zip(betas, pred, meas)
        ]

        out["rules"][r] = {
            "per_chunk": per_chunk,
            "power": _pooled(pred, meas, betas > 0),
            "false_retain": _pooled(pred, meas, betas < 0),
            "null_retain": _pooled(pred, meas, betas == 0),
        }
    return out


def _pooled(pred: np.ndarray, meas: np.ndarray, sel: np.ndarray) -> dict[str, float | None]:
    if not sel.any():
        return {"predicted": None, "measured": None}
    return {"predicted": float(pred[sel].mean()), "measured": float(meas[sel].mean())}


def _define_flags(values: flags.FlagValues) -> None:
    flags.DEFINE_integer("replicates", PowerConfig.replicates, "simulated runs of the gate", flag_values=values)
    flags.DEFINE_integer("n-tasks", PowerConfig.n_tasks, "validation tasks per gate", flag_values=values)
    flags.DEFINE_integer("seed", PowerConfig.seed, "seed of the simulation", flag_values=values)
    flags.DEFINE_bool("json", False, "print the full JSON report", flag_values=values)


def main(argv: Sequence[str] | None = None) -> None:
    args = flagparse.parse("python -m intraskill_jax.skills.power", __doc__, _define_flags, argv)
    report = simulate(PowerConfig(replicates=args.replicates, n_tasks=args.n_tasks, seed=args.seed))
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(
        f"n={args.n_tasks} tasks, {args.replicates} replicates, sigma={report['sigma']:.3f}, "
        f"discordance={report['discordance']:.3f}, "
        f"SE predicted {report['predicted_se']:.4f} / measured {report['measured_se_mean']:.4f}"
    )
    for rule, r in report["rules"].items():
        print(
            f"rule {rule}: power {r['power']['measured']:.3f} (predicted {r['power']['predicted']:.3f}), "
            f"false retain {r['false_retain']['measured']:.3f} (predicted {r['false_retain']['predicted']:.3f}), "
            f"null retain {r['null_retain']['measured']:.3f}"
        )


if __name__ == "__main__":
    main()
