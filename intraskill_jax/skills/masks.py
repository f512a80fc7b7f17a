"""Group contexts during training: which chunks the G siblings of a group see.

Rule (configurable in `MaskConfig`):

1. A fraction `skill_free` of groups (0.2) gets no skill at all: mask all zeros, text "". The count
   per call is floor(f * n) plus one more with probability frac(f * n), so it is f in expectation
   and never further than one group from it.
2. Every other group includes chunk j independently with probability
       p_j = clip(sigmoid(z_j / temperature), floor, ceiling),   z_j = beta_j / se_j,
   from the chunk's latest gate estimate. A chunk without one (before the first gate) gets `prior`
   (0.5). The t-ratio, not beta, drives p_j, so a noisy large beta is not trusted more than a
   precise small one; the floor and ceiling keep every chunk both seen and omitted, which the
   policy needs to stay robust to omission.

These training-time masks are chosen by estimated contribution and so are never fed to the
regression; only the gate's uniform p = 0.5 arm is.

All-wrong groups are retried once with the full skill (`retry_context`); the retry itself and its
record (`rl.rollouts.collect(retry=...)`, `RetryOutcome`) live with the rollouts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from intraskill_jax.agent.episode import SkillContext
from intraskill_jax.skills.bank import SkillBank


@dataclasses.dataclass(frozen=True, kw_only=True)
class MaskConfig:
    """How training groups sample their chunk masks.

    Attributes:
      skill_free: fraction of groups with no skill (the bare prompt).
      prior: inclusion probability of a chunk with no estimate yet.
      floor: lowest inclusion probability of a chunk with an estimate.
      ceiling: highest inclusion probability.
      temperature: divides beta/se before the logistic; larger flattens the probabilities.
    """

    skill_free: float = 0.2
    prior: float = 0.5
    floor: float = 0.1
    ceiling: float = 0.9
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.skill_free <= 1.0:
            raise ValueError(f"skill_free must be in [0, 1], got {self.skill_free}")
        if not 0.0 <= self.floor <= self.ceiling <= 1.0:
            raise ValueError(
                f"need 0 <= floor <= ceiling <= 1, got floor={self.floor}, ceiling={self.ceiling}"
            )
        if not self.floor <= self.prior <= self.ceiling:
            raise ValueError(
                f"prior ({self.prior}) must lie in [floor, ceiling] = [{self.floor}, {self.ceiling}]"
            )
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


def inclusion_probabilities(bank: SkillBank, config: MaskConfig = MaskConfig()) -> np.ndarray:
    """[K] inclusion probability of each active chunk (bank order)."""
    estimates = bank.estimates()
    out = np.full(len(bank.active), config.prior)
    for j, chunk in enumerate(bank.active):
        est = estimates.get(chunk.id)
        if est is None:
            continue
        out[j] = _probability(est, config)
    return out


def _probability(est: Mapping[str, float], config: MaskConfig) -> float:
    # A ledger stores undefined statistics as null.
    beta, se = (float("nan") if est.get(k) is None else float(est[k]) for k in ("beta", "se"))
    if not np.isfinite(beta):
        return config.prior
    if beta == 0:
        z = 0.0
    elif not np.isfinite(se) or se <= 0:
        z = np.sign(beta) * np.inf  # exact estimate: all the way to floor or ceiling
    else:
        z = beta / se
    p = 0.5 if z == 0 else float(1.0 / (1.0 + np.exp(-z / config.temperature)))
    return float(np.clip(p, config.floor, config.ceiling))


def sample_contexts(
    bank: SkillBank,
    n_groups: int,
    rng: np.random.Generator,
    lang: str,
    config: MaskConfig = MaskConfig(),
) -> list[SkillContext]:
    """One context per group: the rendered skill text and the mask over `bank.active_ids`."""
    if n_groups < 0:
        raise ValueError(f"n_groups must be >= 0, got {n_groups}")
    k = len(bank.active)
    expected = config.skill_free * n_groups
    n_free = int(np.floor(expected)) + int(rng.random() < expected - np.floor(expected))
    free = np.zeros(n_groups, bool)
    free[rng.permutation(n_groups)[:n_free]] = True
    masks = rng.random((n_groups, k)) < inclusion_probabilities(bank, config)[None, :]
    masks[free] = False
    return [
        SkillContext(skill_text=bank.render(m, lang), skill_mask=tuple(int(v) for v in m))
        for m in masks
    ]


def retry_context(bank: SkillBank, lang: str) -> SkillContext:
    """The full-skill context an all-wrong group is retried with."""
    mask = bank.full_mask()
    return SkillContext(skill_text=bank.render(mask, lang), skill_mask=mask)
