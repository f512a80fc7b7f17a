"""The GRPO update on a batch of multi-turn episodes of mixed lengths: every micro-batch at the
batch's collated length against each at its own (`rl.train_step.length_groups`).

    python -m intraskill_jax.bench.update --json                  # SmolLM2-135M as configs/smollm2_cpu.py trains it

The batch is what a GRPO step hands the learner: `rows` right-padded episodes whose lengths spread
evenly over [`shortest`, `longest`] (SmolLM2's first step on the shop: ~1,100-2,400 tokens),
collated to `bucket_length` of the longest, 15% of each row's tokens sampled (trained). The model
and the update are the run's: LoRA, full remat, scanned layers, micro-batches of `micro` rows,
random weights. Both sides run the same batch from the same state; the padded side is forced by
a length grid coarser than the batch (`length_multiple` above its width). One warm-up call of
each compiles it, then `rounds` alternating timed calls (order swapped each round); each side's
best counts. The JSON carries every round, the tokens each side computes and the load averages.

    python -m intraskill_jax.bench.update --json --remat=full,minimal   # remat policies as peers

Each further `--remat` policy adds a grouped side (`grouped:<policy>`, the same batch and
weights); `temp_gib` is XLA's temporary buffer size of one micro-batch's program at the batch's
width under each policy, the memory remat trades for speed.

The `transformers` side (`--reference`, on by default; needs torch) is the same update written the
way a careful PyTorch trainer would: the same weights (exported through `save_pretrained`) in
transformers' own model class, peft's LoRA formulation on the same layers (rank, scale, A
He-uniform, B zero, the base frozen), gradient checkpointing per decoder layer (what full remat
is), the same micro-batches each cut to its own length, only the trained positions projected to
the vocabulary, the same clipped, truncated-importance-weighted token-mean loss, then global-norm
clipping and AdamW. `speedup_vs_transformers` = its time over the grouped side's. Both sides' first
losses are in the JSON (`first_loss`): the adapters start at zero, so they must agree.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as bench.model: before OpenBLAS loads

import jax
import numpy as np
from absl import flags
from flax import nnx

from sim import flagparse

from intraskill_jax import allocator
from intraskill_jax.agent.trajectory import bucket_length
from intraskill_jax.bench import model as model_bench
from intraskill_jax.models import ModelConfig, causal_lm_class
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models.lora import LoRAConfig
from intraskill_jax.rl import train_step as ts
from intraskill_jax.rl.grpo import LossConfig

SIZES: dict[str, Callable[[str], ModelConfig]] = {  # remat policy -> config
    "smollm2": lambda remat: ModelConfig.smollm2_135m(dtype="float32", param_dtype="float32", remat=remat,
                                                      scan_layers=True, **model_bench.KERNELS["cpu"]),
}


def _batch(rows: int, shortest: int, longest: int, vocab: int, seed: int = 0) -> ts.TrainBatch:
    rng = np.random.default_rng(seed)
    lengths = np.linspace(longest, shortest, rows).astype(int)
    width = bucket_length(int(lengths.max()))
    tokens = np.zeros((rows, width), np.int32)
    attention = np.zeros((rows, width), np.int32)
    loss_mask = np.zeros((rows, width), np.float32)
    for b, n in enumerate(lengths):
        tokens[b, :n] = rng.integers(1, vocab, n)
        attention[b, :n] = 1
        loss_mask[b, :n] = rng.random(n) < 0.15
    collated = {"tokens": tokens, "attention_mask": attention, "loss_mask": loss_mask,
                "rollout_logprobs": np.where(loss_mask > 0, -1.0, 0.0).astype(np.float32)}
    advantages = np.where(np.arange(rows) % 2 == 0, 1.0, -1.0)
    return ts.train_batch(collated, advantages=advantages, compact=True)


def _temp_gib(step: ts.UpdateStep, state: ts.TrainState, batch: ts.TrainBatch, micro: int) -> float | None:
    """XLA's temporary buffers of one micro-batch's update at the batch's width, or None where the
    backend reports no memory analysis."""
    one = jax.tree.map(lambda x: x[:micro], batch)
    analysis = step.trace(state, one).lower().compile().memory_analysis()
    return None if analysis is None else analysis.temp_size_in_bytes / 2**30


def _transformers_update(model: nnx.Module, groups: list[ts.TrainBatch], lora: LoRAConfig, optim: ts.OptimConfig,
                         loss: LossConfig) -> Callable[[], float]:
    """The update of `groups` (one batch's micro-batches) in PyTorch on `model`'s weights; returns a
    call that runs it once and returns its loss."""
    try:
        import torch
        import transformers  # noqa: F401  (model_bench.transformers_copy's)
    except ImportError as e:
        raise SystemExit(f"the transformers side needs torch and transformers ({e}): pip install -e '.[test]', "
                         "or pass --noreference") from e

    hf = model_bench.transformers_copy(lora_lib.without_adapters(model))
    hf.requires_grad_(False)

    class LoRALinear(torch.nn.Module):  # peft's formulation: W x + scale * B (A x), W frozen
        def __init__(self, base: torch.nn.Linear):
            super().__init__()
            self.base = base
            self.lora_a = torch.nn.Linear(base.in_features, lora.rank, bias=False)
            self.lora_b = torch.nn.Linear(lora.rank, base.out_features, bias=False)
            torch.nn.init.kaiming_uniform_(self.lora_a.weight, a=5**0.5)
            torch.nn.init.zeros_(self.lora_b.weight)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + self.lora_b(self.lora_a(x)) * lora.scale

    for module in list(hf.modules()):
        for attr, child in list(module.named_children()):
            if attr in lora.targets and isinstance(child, torch.nn.Linear):
                setattr(module, attr, LoRALinear(child))
    params = [p for p in hf.parameters() if p.requires_grad]
    if hasattr(hf, "activation_checkpointing_enable"):  # transformers >= 5.x (the older name warns there)
        hf.activation_checkpointing_enable({"use_reentrant": False})
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    hf.train()
    opt = torch.optim.AdamW(params, lr=optim.learning_rate, betas=(optim.b1, optim.b2), eps=optim.eps,
                            weight_decay=optim.weight_decay)
    tensors = []
    for g in groups:
        real = np.asarray(g.attention_mask).any(axis=1)  # a last micro-batch's empty padding rows train nothing
        tensors.append({k: torch.as_tensor(np.asarray(getattr(g, k))[real]) for k in
                        ("input_ids", "attention_mask", "loss_mask", "advantages", "rollout_logprobs")} |
                       {k: torch.as_tensor(np.asarray(getattr(g, k))[real].astype(np.int64))  # indices
                        for k in ("targets", "target_positions")})
    total = sum(float(t["loss_mask"].sum()) for t in tensors)

    def micro_loss(t: dict[str, torch.Tensor]) -> torch.Tensor:
        hidden = hf.model(input_ids=t["input_ids"], attention_mask=t["attention_mask"],
                          use_cache=False).last_hidden_state
        picked = torch.gather(hidden, 1, t["target_positions"][..., None].expand(-1, -1, hidden.shape[-1]))
        logp_all = torch.log_softmax(hf.lm_head(picked).float(), dim=-1)
        logp = torch.gather(logp_all, -1, t["targets"][..., None]).squeeze(-1)
        with torch.no_grad():  # ours computes the entropy for its metrics: the same work here
            _ = -(logp_all.exp() * logp_all).sum(-1)
        adv = t["advantages"].float()[:, None]
        ratio = torch.exp(torch.clamp(logp - logp.detach(), -20.0, 20.0))  # on-policy: 1, with its gradient
        per = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1.0 - loss.clip_low, 1.0 + loss.clip_high))
        if loss.dual_clip is not None:
            per = torch.where(adv < 0, torch.minimum(per, -adv * loss.dual_clip), per)
        if loss.tis_cap is not None:
            per = per * torch.clamp(torch.exp(torch.clamp(logp.detach() - t["rollout_logprobs"], -20.0, 20.0)),
                                    max=loss.tis_cap)
        return (per * t["loss_mask"]).sum() / max(total, 1.0)

    def update() -> float:
        opt.zero_grad(set_to_none=True)
        value = 0.0
        for t in tensors:
            part = micro_loss(t)
            part.backward()
            value += float(part.detach())
        if optim.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, optim.grad_clip)
        opt.step()
        return value

    return update


def run(size: str = "smollm2", *, rows: int = 4, shortest: int = 1100, longest: int = 2400, micro: int = 2,
        rounds: int = 1, remat: Sequence[str] = ("full",), reference: bool = True) -> dict[str, Any]:
    optim = ts.OptimConfig(learning_rate=1e-6, micro_batch_size=micro)
    tx = ts.make_optimizer(optim)
    lora = LoRAConfig(enabled=True, rank=16, alpha=32.0)
    # One model per remat policy, all with the same weights (the policy changes no parameter).
    graphdefs, states, models = {}, {}, {}
    for policy in remat:
        config = SIZES[size](policy)
        models[policy] = lora_lib.apply_lora(causal_lm_class(config)(config, rngs=nnx.Rngs(0)), lora)
        graphdefs[policy], states[policy] = ts.init_train_state(models[policy], tx)
    first = remat[0]
    batch = _batch(rows, shortest, longest, config.vocab_size)
    width = batch.input_ids.shape[1]
    sides = {"padded": (first, 2 * width), "grouped": (first, 128),
             **{f"grouped:{policy}": (policy, 128) for policy in remat[1:]}}
    steps = {side: ts.grpo_step(graphdefs[policy], tx, optim, LossConfig(), donate=False,
                                length_multiple=multiple)
             for side, (policy, multiple) in sides.items()}
    temp_gib = {policy: _temp_gib(steps["padded" if policy == first else f"grouped:{policy}"],
                                  states[policy], batch, micro) for policy in remat}
    groups = ts.length_groups(batch, micro, 128)
    grouped_tokens = sum(g.input_ids.size for g in groups) if groups else None
    computed = {side: int(np.ceil(rows / micro) * micro * width) if side == "padded" else grouped_tokens
                for side in sides}
    def ours(side: str) -> float:
        _, metrics = jax.block_until_ready(steps[side](states[sides[side][0]], batch))
        return float(metrics["loss"])

    calls: dict[str, Callable[[], float]] = {side: functools.partial(ours, side) for side in steps}
    if reference:
        calls["transformers"] = _transformers_update(models[first], groups or [batch], lora, optim, LossConfig())
        computed["transformers"] = computed["grouped"]
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {side: [] for side in calls}
    first_loss: dict[str, float] = {}
    for i in range(rounds + 1):
        for side in (list(calls) if i % 2 == 0 else list(calls)[::-1]):
            start = time.perf_counter()
            value = calls[side]()  # returns once the update has finished
            if i:  # the first call of each compiles it
                times[side].append(time.perf_counter() - start)
            else:
                first_loss[side] = value
    tokens = int(np.asarray(batch.attention_mask).sum())
    best = {side: min(t) for side, t in times.items()}
    return {"size": size, "rows": rows, "micro": micro, "width": width, "tokens": tokens, "remat": list(remat),
            "computed_tokens": computed, "seconds": best, "seconds_all": times,
            "tokens_per_s": {side: tokens / s for side, s in best.items()},
            "speedup_grouped": best["padded"] / best["grouped"],
            "speedup_remat": {policy: best["grouped"] / best[f"grouped:{policy}"] for policy in remat[1:]},
            **({"speedup_vs_transformers": best["transformers"] / best["grouped"]} if reference else {}),
            "first_loss": first_loss,
            "temp_gib": temp_gib,
            "allocator": allocator.active(), "load_before": load_before, "load_after": os.getloadavg(),
            "jax": jax.__version__, "device": jax.devices()[0].device_kind}


def _define_flags(values: flags.FlagValues) -> None:
    flags.DEFINE_bool("json", False, "print one JSON object", flag_values=values)
    flags.DEFINE_enum("size", "smollm2", sorted(SIZES), "model", flag_values=values)
    flags.DEFINE_integer("rows", 4, "episodes in the batch", flag_values=values)
    flags.DEFINE_integer("shortest", 1100, "the shortest episode (tokens)", flag_values=values)
    flags.DEFINE_integer("longest", 2400, "the longest episode (tokens)", flag_values=values)
    flags.DEFINE_integer("micro", 2, "rows per micro-batch", flag_values=values)
    flags.DEFINE_integer("rounds", 1, "alternating timed rounds (each side's best counts)", flag_values=values)
    flags.DEFINE_bool("reference", True, "time the same update in transformers (PyTorch) too", flag_values=values)
    flags.DEFINE_list("remat", ["full"], "remat policies (the first is the padded side's; each further one "
                      "adds a grouped side)", flag_values=values)


def main(argv: Sequence[str] | None = None) -> None:
    if argv is None:  # run as a program: the allocator users get (intraskill_jax/allocator.py)
        allocator.ensure()
    values = flagparse.parse("python -m intraskill_jax.bench.update", __doc__, _define_flags, argv)
    result = run(values.size, rows=values.rows, shortest=values.shortest, longest=values.longest,
                 micro=values.micro, rounds=values.rounds, remat=values.remat,
                 reference=values.reference)
    print(json.dumps(result) if values.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
