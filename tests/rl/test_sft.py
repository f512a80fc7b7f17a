"""Supervised warm start on oracle demonstrations from a small simulator world."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from intraskill_jax.agent.demos import action_kind, oracle_demonstrations
from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec
from intraskill_jax.checkpoint import Checkpointer
from intraskill_jax.metrics import MetricsWriter, read_metrics
from intraskill_jax.models import ModelConfig, causal_lm_class, load_pretrained, save_pretrained
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models.lora import LoRAConfig
from intraskill_jax.rl import train_step as ts
from intraskill_jax.rl.sft import SFTConfig, assistant_logprob, oracle_agreement, reply_logprobs, run_sft, sft_batches
from intraskill_jax.tokenization import train_tokenizer
from sim.config import CatalogConfig, SimConfig, SplitConfig
from sim.env import ShopEnv
from sim.world import build_world

AGENT = AgentConfig(tool_format="json", max_observation_chars=400, show_affordances=False, max_turns=10)


@functools.cache
def _world():
    return build_world(SimConfig(catalog=CatalogConfig(num_products=300, persona_fraction=0.0),
                                 splits=SplitConfig(num_test=20, num_validation=10)))


@pytest.fixture(scope="module")
def demos():
    world = _world()

    def play(tokenizer, task_ids):
        specs = [EpisodeSpec(int(t)) for t in task_ids]
        return oracle_demonstrations([ShopEnv(world, world.config.env) for _ in specs], tokenizer, specs, AGENT)

    # A tokenizer fitted to the conversations themselves keeps demonstrations near 1K tokens.
    texts = [world.catalog[i].title for i in range(300)] + [t.instruction for t in world.catalog.tasks[:150]]
    rough = train_tokenizer(texts, vocab_size=600, tool_format="json")
    corpus = [rough.decode(t.token_ids) for t in play(rough, world.splits.train[100:140])]
    tokenizer = train_tokenizer(texts + corpus, vocab_size=1000, tool_format="json")
    trajectories = [t for t in play(tokenizer, world.splits.train[:60]) if len(t.token_ids) <= 1024][:6]
    assert len(trajectories) == 6 and all(t.success for t in trajectories)
    return tokenizer, trajectories


def _model(tokenizer):
    config = ModelConfig.tiny_qwen3(vocab_size=len(tokenizer))
    return causal_lm_class(config)(config, rngs=nnx.Rngs(0))


def test_sft_learns_the_demonstrated_actions(demos, tmp_path):
    tokenizer, trajectories = demos
    pad = tokenizer.pad_token_id
    model = _model(tokenizer)
    before = assistant_logprob(model, trajectories, pad_id=pad)
    # 3 rows per update in 2 micro-batches (one padding row): the accumulation path, 10 updates.
    config = SFTConfig(optim=ts.OptimConfig(learning_rate=1e-2, warmup_steps=2, micro_batch_size=2),
                       batch_size=3, epochs=5, checkpoint_every=5)
    with MetricsWriter(tmp_path, tensorboard=False) as writer, Checkpointer(tmp_path / "ckpt") as ckpt:
        result = run_sft(model, trajectories, config, pad_id=pad, writer=writer, checkpointer=ckpt, progress=False)
    losses = [row["train/sft_loss"] for row in result.history]
    assert len(losses) == config.num_updates(len(trajectories)) == 10
    assert losses[0] > 6.0 and np.mean(losses[-2:]) < 0.5 * losses[0]
    after = assistant_logprob(model, trajectories, pad_id=pad)  # `model` now holds the trained weights
    assert before < -6.0 and after > before + 3.0
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert {"train/sft_loss", "train/sft_grad_norm", "train/sft_lr", "train/sft_tokens"} <= rows[0].keys()

    # A rerun with the same checkpointer finds the run finished and restores its weights.
    fresh = _model(tokenizer)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        assert ckpt.all_steps() == [5, 10]
        again = run_sft(fresh, trajectories, config, pad_id=pad, checkpointer=ckpt, progress=False)
    assert again.history == [] and assistant_logprob(fresh, trajectories, pad_id=pad) == pytest.approx(after)


def test_sft_with_lora_trains_the_adapters_and_publishes_them_merged(demos, tmp_path):
    tokenizer, trajectories = demos
    pad = tokenizer.pad_token_id
    model = _model(tokenizer)
    base = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
    before = assistant_logprob(model, trajectories, pad_id=pad)
    config = SFTConfig(optim=ts.OptimConfig(learning_rate=3e-2, warmup_steps=2, micro_batch_size=2), batch_size=3,
                       epochs=5, checkpoint_every=5, lora=LoRAConfig(enabled=True, rank=8, alpha=16.0))
    result = run_sft(model, trajectories, config, pad_id=pad, progress=False)
    losses = [row["train/sft_loss"] for row in result.history]
    # A random base with its embeddings and head frozen learns slowly; it still learns.
    assert np.mean(losses[-2:]) < losses[0] - 0.2
    after = assistant_logprob(model, trajectories, pad_id=pad)  # `model` now holds the adapters
    assert lora_lib.has_adapters(model) and after > before + 0.2
    frozen = [np.asarray(x) for x in jax.tree.leaves(lora_lib.base_params(nnx.state(model, nnx.Param)))]
    assert len(frozen) == len(base) and all(np.array_equal(a, b) for a, b in zip(frozen, base))
    # What the warm start publishes: the adapters merged into a plain checkpoint.
    save_pretrained(model, tmp_path / "hf")
    merged = load_pretrained(tmp_path / "hf")
    assert not lora_lib.has_adapters(merged)
    assert assistant_logprob(merged, trajectories, pad_id=pad) == pytest.approx(after, rel=1e-4)


def test_loss_counts_only_assistant_tokens(demos):
    tokenizer, trajectories = demos
    model = _model(tokenizer)
    batch = next(sft_batches(trajectories, SFTConfig(batch_size=3), pad_id=tokenizer.pad_token_id))
    mask = batch.loss_mask
    assert 0 < mask.sum() < 0.3 * batch.attention_mask.sum()  # replies are a small part of the context
    totals = ts.Totals(tokens=jnp.float32(mask.sum()), sequences=jnp.float32((mask.sum(1) > 0).sum()))
    loss = nnx.jit(lambda m, b: ts.sft_micro_loss(m, b, totals)[0])

    base = float(loss(model, batch))
    # The same value from full-vocabulary logits: NLL averaged over assistant targets only.
    # (The batch is compact, replies only: entry k of row b is the target of position target_positions[b, k].)
    logp = jax.nn.log_softmax(model(jnp.asarray(batch.input_ids), attention_mask=jnp.asarray(batch.attention_mask)))
    logp = np.take_along_axis(np.asarray(logp), batch.target_positions[..., None], axis=1)
    picked = np.take_along_axis(logp, batch.targets[..., None], axis=-1)[..., 0]
    assert base == pytest.approx(-(picked * mask).sum() / mask.sum(), rel=1e-5)

    rng = np.random.default_rng(0)
    noise = rng.integers(0, len(tokenizer), batch.targets.shape).astype(batch.targets.dtype)
    other = np.where(mask > 0, batch.targets, noise)  # every non-assistant target replaced
    assert (other != batch.targets).mean() > 0.5
    assert float(loss(model, batch._replace(targets=other))) == base
    b, t = map(int, np.argwhere(mask > 0)[0])
    one = batch.targets.copy()
    one[b, t] = (one[b, t] + 1) % len(tokenizer)
    assert float(loss(model, batch._replace(targets=one))) != base


def test_context_loss_weight_trains_every_real_token(demos):
    tokenizer, trajectories = demos
    pad = tokenizer.pad_token_id
    plain = next(sft_batches(trajectories, SFTConfig(batch_size=3), pad_id=pad))
    mixed = next(sft_batches(trajectories, SFTConfig(batch_size=3, context_loss_weight=0.25), pad_id=pad))
    # A prediction is real when the token it predicts is a real token.
    real = np.concatenate([plain.attention_mask[:, 1:], np.zeros_like(plain.attention_mask[:, :1])], axis=1) > 0
    replies = np.zeros(real.shape)  # the plain batch is compact: its reply targets back at their positions
    np.add.at(replies, (np.arange(len(real))[:, None], plain.target_positions), plain.loss_mask)
    assert replies.sum() == plain.loss_mask.sum() > 0
    expected = np.where(replies > 0, 1.0, np.where(real, 0.25, 0.0))
    np.testing.assert_array_equal(mixed.loss_mask, expected)
    assert (mixed.loss_mask == 0.25).sum() > 2 * (mixed.loss_mask == 1.0).sum()
    with pytest.raises(ValueError, match="context_loss_weight"):
        SFTConfig(context_loss_weight=1.5)


def test_reply_logprobs_sum_each_reply_from_full_logits(demos):
    tokenizer, trajectories = demos
    model = _model(tokenizer)
    got = reply_logprobs(model, trajectories[:3], pad_id=tokenizer.pad_token_id, batch_size=2)
    for traj, replies in zip(trajectories[:3], got):
        ids = np.asarray(traj.token_ids)
        logp = np.asarray(jax.nn.log_softmax(model(jnp.asarray(ids[None]))))[0]
        token_lp = np.concatenate([[0.0], logp[np.arange(len(ids) - 1), ids[1:]]])  # token i given ids[:i]
        mask = np.asarray(traj.loss_mask)
        starts = [i for i in range(len(ids)) if mask[i] and (i == 0 or not mask[i - 1])]
        ends = [i + 1 for i in range(len(ids)) if mask[i] and (i + 1 == len(ids) or not mask[i + 1])]
        assert len(replies) == len(traj.turns) == len(starts)
        np.testing.assert_allclose(replies, [token_lp[i:j].sum() for i, j in zip(starts, ends)], rtol=1e-4)


def test_oracle_agreement_groups_reply_chances_by_action_kind(demos):
    tokenizer, trajectories = demos
    catalog = _world().catalog
    asin = catalog.asin(7)
    assert [action_kind(a, catalog) for a in (f"click[{asin}]", "click[Blue]", "click[< prev]", "click[buy now]",
                                              "search[blue pillow]", "ask[which size?]", "click[1234]")] == \
        ["product", "option", "navigate", "buy", "search", "ask", "option"]
    model = _model(tokenizer)
    got = oracle_agreement(model, trajectories, catalog, pad_id=tokenizer.pad_token_id)
    chances: dict[str, list[float]] = {}
    for traj, replies in zip(trajectories, reply_logprobs(model, trajectories, pad_id=tokenizer.pad_token_id)):
        for turn, lp in zip(traj.turns, replies):
            chances.setdefault(action_kind(turn.action, catalog), []).append(np.exp(lp))
    assert {"search", "product", "buy"} <= got.keys() == chances.keys()
    for kind, values in chances.items():
        assert got[kind] == pytest.approx(np.mean(values))
