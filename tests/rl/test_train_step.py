"""The optimizer, the micro-batched GRPO update and trainer-side log-probs, on tiny Qwen3 models.

Exactness claims are checked against the single-pass update: micro-batching (with padding rows),
an 8-device mesh and rematerialisation must all give the same new parameters. Adam's eps is
raised in these tests so parameters whose gradient is ~0 (round-off only) move by ~0 instead of
by +-lr, which would hide real differences behind sign noise.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from intraskill_jax.models import ModelConfig, causal_lm_class, sharding, token_logprobs
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models.lora import LoRAConfig
from intraskill_jax.rl import train_step as ts
from intraskill_jax.rl.grpo import LossConfig, policy_loss

CONFIG = ModelConfig.tiny_qwen3()
OPTIM = ts.OptimConfig(learning_rate=1e-3, eps=1e-4, weight_decay=0.01, grad_clip=0.05, warmup_steps=2)
LOSS = LossConfig(kl_coef=0.01)
TEMPERATURE = 0.8


def _factory(config: ModelConfig = CONFIG):
    return lambda: causal_lm_class(config)(config, rngs=nnx.Rngs(3))


def _model(config: ModelConfig = CONFIG, mesh=None):
    # Initialised under jit on a mesh (one device by default) so every variant starts from
    # bit-identical weights.
    mesh = mesh or sharding.make_mesh(sharding.MeshConfig(fsdp=1), devices=jax.devices()[:1])
    return sharding.create_sharded(_factory(config), mesh)


def _collated(rows: int = 8, length: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    """Right-padded conversations with two sampled spans each, as `collate` lays them out."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CONFIG.vocab_size, (rows, length)).astype(np.int32)
    attention = np.zeros((rows, length), np.int32)
    loss_mask = np.zeros((rows, length), np.float32)
    for b in range(rows):
        n = int(rng.integers(length // 2, length + 1))
        attention[b, :n] = 1
        tokens[b, n:] = 0
        loss_mask[b, 6:10] = 1
        loss_mask[b, 14:n] = rng.random(n - 14) < 0.7
    rollout = np.where(loss_mask > 0, -rng.random((rows, length)) * 4, 0.0).astype(np.float32)
    return {"tokens": tokens, "attention_mask": attention, "loss_mask": loss_mask, "rollout_logprobs": rollout}


def _max_diff(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _to_host(tree):
    return jax.tree.map(lambda x: np.asarray(jax.device_get(x)), tree)


@pytest.fixture(scope="module")
def setup():
    """Initial state, an off-policy GRPO batch, and the single-pass reference update."""
    tx = ts.make_optimizer(OPTIM)
    graphdef, state = ts.init_train_state(_model(), tx)
    collated = _collated()
    logprob_fn = ts.LogprobFn(graphdef, temperature=TEMPERATURE, micro_batch_size=3)  # padded to 9 rows
    current = np.asarray(logprob_fn(state.params, collated))
    rng = np.random.default_rng(1)
    # Old log-probs off the current ones so some ratios leave the clip range.
    old = np.where(collated["loss_mask"] > 0, current + rng.normal(0, 0.3, current.shape), 0).astype(np.float32)
    ref = np.where(collated["loss_mask"] > 0, current + rng.normal(0, 0.1, current.shape), 0).astype(np.float32)
    advantages = rng.normal(size=8).astype(np.float32)
    batch = ts.train_batch(collated, advantages=advantages, old_logprobs=old, ref_logprobs=ref)
    step = ts.grpo_step(graphdef, tx, OPTIM, LOSS, temperature=TEMPERATURE, donate=False)
    new_state, metrics = step(state, batch)
    return {"tx": tx, "graphdef": graphdef, "state": state, "collated": collated, "current": current,
            "batch": batch, "logprob_fn": logprob_fn, "step": step, "new_state": _to_host(new_state),
            "metrics": _to_host(metrics)}


def test_optim_config_schedule_and_validation():
    sched = ts.learning_rate_schedule(ts.OptimConfig(learning_rate=1.0, warmup_steps=4, schedule="cosine",
                                                     total_steps=8, min_lr_ratio=0.1))
    lrs = [float(sched(k)) for k in range(9)]
    np.testing.assert_allclose(lrs[:4], [0.25, 0.5, 0.75, 1.0], rtol=1e-6)  # first update already moves
    assert lrs[4] == pytest.approx(1.0) and lrs[8] == pytest.approx(0.1) and lrs[5] > lrs[6] > lrs[7]
    assert float(ts.learning_rate_schedule(ts.OptimConfig(learning_rate=0.3))(100)) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="total_steps"):
        ts.OptimConfig(schedule="cosine", warmup_steps=10, total_steps=5)
    with pytest.raises(ValueError, match="micro_batch_size"):
        ts.OptimConfig(micro_batch_size=0)
    with pytest.raises(ValueError, match="grad_clip"):
        ts.OptimConfig(grad_clip=0.0)


def test_weight_decay_skips_vectors():
    params = {"w": jnp.ones((2, 2)), "norm": jnp.ones((2,))}
    tx = ts.make_optimizer(ts.OptimConfig(learning_rate=0.1, weight_decay=0.5, grad_clip=None))
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    assert float(jnp.abs(updates["norm"]).max()) == 0.0 and float(updates["w"][0, 0]) == pytest.approx(-0.05)


def test_train_batch_shifts_to_prediction_alignment_and_pads_empty_rows():
    collated = _collated(rows=3, length=24)
    batch = ts.train_batch(collated, advantages=np.ones(3))
    np.testing.assert_array_equal(batch.targets[:, :-1], collated["tokens"][:, 1:])
    np.testing.assert_array_equal(batch.loss_mask[:, :-1], collated["loss_mask"][:, 1:])
    assert batch.loss_mask[:, -1].sum() == 0 and batch.old_logprobs is None
    padded = ts.pad_rows(batch, 4)
    assert padded.num_rows == 4 and padded.loss_mask[3].sum() == 0 and padded.advantages[3] == 0
    assert padded.attention_mask[3].all()  # no fully masked row
    with pytest.raises(ValueError, match="advantages"):
        ts.train_batch(collated, advantages=np.ones(4))


def test_reference_update_metrics(setup):
    m, batch = setup["metrics"], setup["batch"]
    assert m["tokens"] == batch.loss_mask.sum() and m["sequences"] == 8
    assert m["clipfrac_low"] + m["clipfrac_high"] > 0  # the batch really exercises clipping
    assert m["grad_norm"] > OPTIM.grad_clip  # and global-norm clipping
    assert m["lr"] == pytest.approx(OPTIM.learning_rate / OPTIM.warmup_steps)
    assert np.isfinite(m["entropy"]) and m["entropy"] > 0 and "kl" in m and "tis_weight_mean" in m
    assert int(setup["new_state"].step) == 1


def test_four_micro_batches_give_the_single_pass_update(setup):
    optim = dataclasses.replace(OPTIM, micro_batch_size=2)
    step = ts.grpo_step(setup["graphdef"], setup["tx"], optim, LOSS, temperature=TEMPERATURE, donate=False)
    state, metrics = step(setup["state"], setup["batch"])
    assert _max_diff(state.params, setup["new_state"].params) < 1e-6
    assert _max_diff(state.opt_state, setup["new_state"].opt_state) < 1e-6
    for name, value in setup["metrics"].items():
        np.testing.assert_allclose(metrics[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


def test_micro_batch_losses_sum_to_the_global_sequence_mean(setup):
    """seq-mean-token-mean over 3 micro-batches, one padded with an empty row: the summed loss is
    the full-batch loss (the same accumulation code then sums the gradients)."""
    loss = dataclasses.replace(LOSS, aggregation="seq-mean-token-mean")
    optim = dataclasses.replace(OPTIM, micro_batch_size=3)
    step = ts.grpo_step(setup["graphdef"], setup["tx"], optim, loss, temperature=TEMPERATURE, donate=False)
    _, metrics = step(setup["state"], setup["batch"])
    b = setup["batch"]
    # The current policy's log-probs, moved to prediction alignment like the batch.
    logprobs = ts.train_batch(setup["collated"], old_logprobs=setup["current"]).old_logprobs
    full = policy_loss(logprobs, b.old_logprobs, b.advantages, b.loss_mask, loss,
                       rollout_logprobs=b.rollout_logprobs, ref_logprobs=b.ref_logprobs)
    np.testing.assert_allclose(metrics["loss"], full.loss, rtol=1e-5)
    np.testing.assert_allclose(metrics["pg_loss"], full.metrics["pg_loss"].mean, rtol=1e-5)
    assert metrics["sequences"] == 8


@pytest.mark.parametrize("mesh_config,micro", [(sharding.MeshConfig(data=2, fsdp=2, tensor=2), 4),
                                               (sharding.MeshConfig(fsdp=8), None)], ids=["d2f2t2", "fsdp8"])
def test_sharded_update_matches_one_device(setup, mesh_config, micro):
    mesh = sharding.make_mesh(mesh_config)
    graphdef, state = ts.init_train_state(_model(mesh=mesh), setup["tx"], mesh=mesh)
    assert _max_diff(state.params, setup["state"].params) == 0.0
    optim = dataclasses.replace(OPTIM, micro_batch_size=micro)
    step = ts.grpo_step(graphdef, setup["tx"], optim, LOSS, temperature=TEMPERATURE, mesh=mesh)
    layout = jax.tree.map(lambda x: x.sharding, state)
    state, metrics = step(state, setup["batch"])  # donated: the old buffers are reused
    assert jax.tree.map(lambda x: x.sharding, state) == layout
    embed = state.params["model"]["embed_tokens"]["weight"].get_value()
    assert embed.sharding.spec == layout.params["model"]["embed_tokens"]["weight"].get_value().spec
    assert len({s.device for s in embed.addressable_shards}) == 8
    assert _max_diff(state.params, setup["new_state"].params) < 1e-6
    for name, value in setup["metrics"].items():
        np.testing.assert_allclose(metrics[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


def _mixed_lengths(rows: int = 8, length: int = 64):
    """A GRPO batch whose rows span 4x in length (16-64 tokens), like a step's multi-turn episodes,
    and padding rows after them (a learner pads to a fixed row count)."""
    collated = _collated(rows=rows, length=length, seed=5)
    lengths = np.linspace(16, length, rows).astype(int)[np.random.default_rng(5).permutation(rows)]
    for b, n in enumerate(lengths):
        collated["attention_mask"][b, :n] = 1
        collated["attention_mask"][b, n:] = 0
        collated["tokens"][b, n:] = 0
        collated["loss_mask"][b, n:] = 0
        collated["rollout_logprobs"][b, n:] = 0
    rng = np.random.default_rng(6)
    advantages = rng.normal(size=rows).astype(np.float32)
    trained = collated["loss_mask"] > 0
    old, ref = (np.where(trained, collated["rollout_logprobs"] + rng.normal(0, s, trained.shape), 0).astype(np.float32)
                for s in (0.3, 0.1))
    return ts.pad_rows(ts.train_batch(collated, advantages=advantages, old_logprobs=old, ref_logprobs=ref), 12), lengths


def test_length_groups_cut_each_micro_batch_to_its_longest_row():
    batch, lengths = _mixed_lengths()
    groups = ts.length_groups(batch, 2, 16)
    # The 4 padding rows are dropped; the 8 real rows go longest first, 2 per micro-batch.
    assert len(groups) == 4 and all(g.num_rows == 2 for g in groups)
    longest = np.sort(lengths)[::-1][::2]
    assert [g.input_ids.shape[1] for g in groups] == [min(64, ts.bucket_length(n, 16)) for n in longest]
    assert [g.input_ids.shape[1] for g in groups] == [64, 64, 48, 32]
    assert sum(float(g.loss_mask.sum()) for g in groups) == float(batch.loss_mask.sum())
    for g in groups:  # nothing attended is cut away
        assert (ts.row_lengths(g) <= g.input_ids.shape[1]).all() and g.targets.shape == g.input_ids.shape
    compact = ts.length_groups(ts.compacted(batch), 2, 16)
    assert [g.input_ids.shape[1] for g in compact] == [64, 64, 48, 32]
    assert all(g.targets.shape[1] == ts.compacted(batch).targets.shape[1] for g in compact)  # [B, K] kept
    # One micro-batch, or every one at the full width: the fused single-program update.
    assert ts.length_groups(batch, 12, 16) is None and ts.length_groups(batch, 2, 128) is None


@pytest.mark.parametrize("compact,mesh_config", [(False, None), (True, None),
                                                 (True, sharding.MeshConfig(data=2, fsdp=2, tensor=2))],
                         ids=["dense", "compact", "compact-d2f2t2"])
def test_micro_batches_at_their_own_lengths_give_the_padded_update(setup, compact, mesh_config):
    """The length-ordered, length-cut micro-batches give the new parameters, optimizer state and
    metrics of one pass over the padded batch (GRPO and SFT), on one device and on a mesh."""
    batch, _ = _mixed_lengths()
    batch = ts.compacted(batch) if compact else batch
    tx = setup["tx"]
    mesh = None if mesh_config is None else sharding.make_mesh(mesh_config)
    graphdef, state = ts.init_train_state(_model(mesh=mesh), tx, mesh=mesh)
    grouped_optim = dataclasses.replace(OPTIM, micro_batch_size=2)
    for make in (lambda optim, **kw: ts.grpo_step(graphdef, tx, optim, LOSS, temperature=TEMPERATURE, **kw),
                 lambda optim, **kw: ts.sft_step(graphdef, tx, optim, **kw)):
        want_state, want = make(OPTIM, donate=False)(state, batch)
        step = make(grouped_optim, donate=False, length_multiple=16, mesh=mesh)
        got_state, got = step(state, batch)
        assert "grouped" in step._compiled and len(step._compiled) == 1  # the fused program never ran
        assert _max_diff(got_state.params, want_state.params) < 1e-6
        assert _max_diff(got_state.opt_state, want_state.opt_state) < 1e-6
        for name, value in _to_host(want).items():
            np.testing.assert_allclose(_to_host(got)[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_remat_gives_the_same_update(setup):
    config = CONFIG.replace(remat="full")
    graphdef, state = ts.init_train_state(_model(config), setup["tx"])
    step = ts.grpo_step(graphdef, setup["tx"], OPTIM, LOSS, temperature=TEMPERATURE, donate=False)
    state, metrics = step(state, setup["batch"])
    assert _max_diff(state.params, setup["new_state"].params) < 1e-7
    np.testing.assert_allclose(metrics["loss"], setup["metrics"]["loss"], rtol=1e-5)


def test_logprob_fn_scores_a_remat_model_as_the_plain_one(setup):
    # The study's configs remat their layers (policy.remat='full'); the pass used to raise
    # TraceContextError on such a model.
    graphdef, state = ts.init_train_state(_model(CONFIG.replace(remat="full")), setup["tx"])
    got = ts.LogprobFn(graphdef, temperature=TEMPERATURE, micro_batch_size=3)(state.params, setup["collated"])
    np.testing.assert_allclose(np.asarray(got), setup["current"], rtol=1e-5, atol=1e-6)


def test_scanned_layers_give_the_same_sharded_update_and_logprobs(setup):
    # The study's configs scan their layers (policy.scan_layers) under remat, micro-batched on a
    # mesh: the parameters keep their layout and the update and the log-prob pass their values.
    config = CONFIG.replace(scan_layers=True, remat="full")
    mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
    graphdef, state = ts.init_train_state(_model(config, mesh=mesh), setup["tx"], mesh=mesh)
    layout = jax.tree.map(lambda x: x.sharding, state)
    got = ts.LogprobFn(graphdef, temperature=TEMPERATURE, micro_batch_size=4, mesh=mesh)(state.params, setup["collated"])
    np.testing.assert_allclose(np.asarray(got), setup["current"], rtol=1e-5, atol=1e-6)
    optim = dataclasses.replace(OPTIM, micro_batch_size=4)
    step = ts.grpo_step(graphdef, setup["tx"], optim, LOSS, temperature=TEMPERATURE, mesh=mesh)
    state, metrics = step(state, setup["batch"])
    assert jax.tree.map(lambda x: x.sharding, state) == layout
    assert _max_diff(state.params, setup["new_state"].params) < 1e-6
    np.testing.assert_allclose(metrics["loss"], setup["metrics"]["loss"], rtol=1e-5)


def test_logprob_fn_matches_the_model_and_the_step(setup):
    graphdef, state, collated = setup["graphdef"], setup["state"], setup["collated"]
    model = nnx.merge(graphdef, state.params)
    tokens, attention = jnp.asarray(collated["tokens"]), jnp.asarray(collated["attention_mask"])
    direct = token_logprobs(model, tokens[:, :-1], tokens[:, 1:], attention[:, :-1], temperature=TEMPERATURE)
    micro = np.asarray(setup["logprob_fn"](state.params, collated))
    trained = collated["loss_mask"] > 0  # only the tokens the loss trains are scored; the rest are 0
    np.testing.assert_allclose(micro[:, 1:][trained[:, 1:]], np.asarray(direct)[trained[:, 1:]], rtol=1e-5, atol=1e-6)
    assert np.all(micro[~trained] == 0.0) and float(np.abs(micro[:, 0]).max()) == 0.0
    np.testing.assert_allclose(micro, setup["current"], rtol=1e-5, atol=1e-6)


def test_compacted_keeps_exactly_the_trained_targets(setup):
    batch = setup["batch"]
    compact = ts.compacted(batch)
    trained = batch.loss_mask > 0
    k = compact.target_positions.shape[1]
    # 64 x 2**j, the smallest holding every row's trained targets, but never more than the length
    assert k == min(64, batch.loss_mask.shape[1]) and trained.sum(axis=1).max() <= k
    for b in range(batch.num_rows):
        n = int(trained[b].sum())
        np.testing.assert_array_equal(compact.target_positions[b, :n], np.flatnonzero(trained[b]))
        for name in ("targets", "loss_mask", "rollout_logprobs", "old_logprobs", "ref_logprobs"):
            dense, kept = getattr(batch, name), getattr(compact, name)
            np.testing.assert_array_equal(kept[b, :n], dense[b][trained[b]])
            assert np.all(kept[b, n:] == 0), name
    np.testing.assert_array_equal(compact.input_ids, batch.input_ids)
    assert ts.compacted(compact) is compact
    long = ts.train_batch(_collated(rows=2, length=300))  # up to ~200 trained targets per row
    assert long.loss_mask.sum(axis=1).max() > 128 and ts.compacted(long).target_positions.shape[1] == 256


@pytest.mark.parametrize("micro", [None, 2])
def test_a_compact_batch_gives_the_dense_update(setup, micro):
    """Scoring only the trained targets changes no sum, count or gradient: the same new parameters
    and metrics as the dense batch, in one pass and in micro-batches (GRPO and SFT)."""
    optim = dataclasses.replace(OPTIM, micro_batch_size=micro)
    graphdef, state, tx, batch = setup["graphdef"], setup["state"], setup["tx"], setup["batch"]
    for make in (lambda: ts.grpo_step(graphdef, tx, optim, LOSS, temperature=TEMPERATURE, donate=False),
                 lambda: ts.sft_step(graphdef, tx, optim, donate=False)):
        dense_state, dense_m = make()(state, batch)
        compact_state, compact_m = make()(state, ts.compacted(batch))
        assert _max_diff(compact_state.params, dense_state.params) < 1e-6
        for name, value in _to_host(dense_m).items():
            np.testing.assert_allclose(_to_host(compact_m)[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_loss_decreases_over_updates_on_a_fixed_batch(setup):
    """PPO-style epochs on one batch, old log-probs recomputed by the trainer: at the first update
    the ratio is exactly 1 (so the step scores the same tokens LogprobFn did), then the
    surrogate loss falls as the policy moves toward positive-advantage tokens."""
    batch = setup["batch"]._replace(old_logprobs=ts.train_batch(setup["collated"], old_logprobs=setup["current"]).old_logprobs)
    state, losses = setup["state"], []
    for k in range(6):
        state, metrics = setup["step"](state, batch)
        losses.append(float(metrics["pg_loss"]))
        if k == 0:
            assert float(metrics["ratio_mean"]) == pytest.approx(1.0, abs=1e-5)
            assert abs(float(metrics["ppo_kl"])) < 1e-5
    assert losses[-1] < losses[0] - 0.05 and all(b <= a + 1e-6 for a, b in itertools.pairwise(losses))


# -- LoRA: the adapters train, the base weights are frozen operands -------------------------------

LORA = LoRAConfig(enabled=True, rank=4, alpha=8.0)


def _lora_state(tx, *, trained_b: bool, mesh=None, config: ModelConfig = CONFIG):
    """A LoRA model's train state; with `trained_b` the adapters' B is random (as after some
    updates), so A gets gradients too (with B = 0 it gets none)."""
    model = lora_lib.apply_lora(_model(config, mesh=mesh), LORA, seed=5)
    if trained_b:
        b_only = nnx.filter_state(nnx.state(model, nnx.LoRAParam), lambda path, _: path[-1] == "lora_b")
        nnx.update(model, jax.tree.map(lambda x: 0.3 * jax.random.normal(jax.random.key(7), x.shape), b_only))
    if mesh is not None:
        sharding.shard_model(model, mesh)
    return ts.init_train_state(model, tx, mesh=mesh)


def _capture_gradients() -> optax.GradientTransformation:
    """An 'optimizer' whose state becomes the gradient it was given and which leaves the parameters."""
    return optax.GradientTransformation(init=lambda p: jax.tree.map(jnp.zeros_like, p),
                                        update=lambda g, s, p=None: (jax.tree.map(jnp.zeros_like, g), g))


def _split_lora(params):
    return nnx.split_state(params, nnx.LoRAParam, ...)


def test_lora_step_trains_the_adapters_alone(setup):
    tx = ts.make_optimizer(OPTIM)
    graphdef, state = _lora_state(tx, trained_b=False)
    adapters, base = _split_lora(_to_host(state.params))
    step = ts.grpo_step(graphdef, tx, OPTIM, LOSS, temperature=TEMPERATURE, donate=False)
    new_state, metrics = step(state, setup["batch"])
    new_adapters, new_base = _split_lora(_to_host(new_state.params))
    assert _max_diff(new_base, base) == 0.0  # the base weights come out bit for bit
    b = [(x, y) for (p, x), (_, y) in zip(nnx.to_flat_state(adapters), nnx.to_flat_state(new_adapters))
         if p[-1] == "lora_b"]
    assert all(np.any(y.get_value() != x.get_value()) for x, y in b)
    # Adam's moments exist for the adapters only: the optimizer state is the adapters' size, twice.
    moments = [x for x in jax.tree.leaves(state.opt_state) if np.ndim(x) >= 1]
    assert sorted(x.shape for x in moments) == sorted(2 * [x.shape for x in jax.tree.leaves(adapters)])
    assert np.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0


def test_lora_step_gradients_equal_jax_grad_of_the_loss(setup):
    """Three micro-batches (one with a padding row) accumulate to the gradient of the whole
    batch's loss with respect to the adapters, taken directly."""
    capture = _capture_gradients()
    graphdef, state = _lora_state(capture, trained_b=True)
    optim = dataclasses.replace(OPTIM, micro_batch_size=3)
    step = ts.grpo_step(graphdef, capture, optim, LOSS, temperature=TEMPERATURE, donate=False)
    new_state, metrics = step(state, setup["batch"])
    adapters, base = _split_lora(state.params)
    b = jax.tree.map(jnp.asarray, setup["batch"])

    def loss(adapters):
        model = nnx.merge(graphdef, adapters, base)
        lp = token_logprobs(model, b.input_ids, b.targets, b.attention_mask, temperature=TEMPERATURE)
        return policy_loss(lp, b.old_logprobs, b.advantages, b.loss_mask, LOSS, rollout_logprobs=b.rollout_logprobs,
                           ref_logprobs=b.ref_logprobs).loss

    direct = jax.grad(loss)(adapters)
    got = new_state.opt_state
    assert jax.tree.structure(got) == jax.tree.structure(direct)
    scale = max(float(np.max(np.abs(x))) for x in jax.tree.leaves(direct))
    assert scale > 0 and all(float(np.max(np.abs(x))) > 0 for x in jax.tree.leaves(direct))  # A and B both
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(direct)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5 * scale)
    norm = np.sqrt(sum(float(jnp.sum(jnp.square(x))) for x in jax.tree.leaves(direct)))
    np.testing.assert_allclose(metrics["grad_norm"], norm, rtol=1e-4)
    assert _max_diff(new_state.params, state.params) == 0.0


def test_lora_update_lowers_the_loss_on_a_fixed_batch(setup):
    tx = ts.make_optimizer(dataclasses.replace(OPTIM, learning_rate=1e-2, grad_clip=None))
    graphdef, state = _lora_state(tx, trained_b=False)
    batch = setup["batch"]._replace(old_logprobs=ts.train_batch(setup["collated"], old_logprobs=setup["current"]).old_logprobs)
    step = ts.grpo_step(graphdef, tx, OPTIM, LOSS, temperature=TEMPERATURE)
    losses = []
    for _ in range(6):
        state, metrics = step(state, batch)
        losses.append(float(metrics["pg_loss"]))
    assert losses[-1] < losses[0] - 0.05 and all(b <= a + 1e-6 for a, b in itertools.pairwise(losses)), losses


@pytest.mark.parametrize("remat", ["none", "full"])
def test_lora_sharded_micro_batched_update_matches_one_device(setup, remat):
    tx = ts.make_optimizer(OPTIM)
    graphdef, one = _lora_state(tx, trained_b=True)
    one_step = ts.grpo_step(graphdef, tx, OPTIM, LOSS, temperature=TEMPERATURE, donate=False)
    expected, expected_metrics = _to_host(one_step(one, setup["batch"]))
    mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
    graphdef, state = _lora_state(tx, trained_b=True, mesh=mesh, config=CONFIG.replace(remat=remat))
    layout = jax.tree.map(lambda x: x.sharding, state)
    step = ts.grpo_step(graphdef, tx, dataclasses.replace(OPTIM, micro_batch_size=4), LOSS, temperature=TEMPERATURE,
                        mesh=mesh)
    state, metrics = step(state, setup["batch"])
    assert jax.tree.map(lambda x: x.sharding, state) == layout
    assert _max_diff(state.params, expected.params) < 1e-6 and _max_diff(state.opt_state, expected.opt_state) < 1e-6
    np.testing.assert_allclose(metrics["loss"], expected_metrics["loss"], rtol=1e-5)


def test_reference_with_adapters_off_is_the_base_model(setup):
    tx = ts.make_optimizer(OPTIM)
    graphdef, state = _lora_state(tx, trained_b=True)
    model = nnx.merge(graphdef, state.params)
    reference = ts.ReferenceLogprobs(model, state.params, temperature=TEMPERATURE, micro_batch_size=3)
    assert reference.lora
    ref = np.asarray(reference(state.params, setup["collated"]))
    assert np.array_equal(ref, np.asarray(setup["logprob_fn"](setup["state"].params, setup["collated"])))
    policy = np.asarray(ts.LogprobFn(graphdef, temperature=TEMPERATURE, micro_batch_size=3)(state.params,
                                                                                          setup["collated"]))
    assert np.max(np.abs(policy - ref)) > 1e-3  # the adapters are on in the policy


def test_reference_without_lora_is_a_frozen_copy_of_the_starting_weights(setup):
    graphdef, state = ts.init_train_state(_model(), setup["tx"])
    reference = ts.ReferenceLogprobs(nnx.merge(graphdef, state.params), state.params, temperature=TEMPERATURE,
                                     micro_batch_size=3)
    assert not reference.lora
    step = ts.grpo_step(graphdef, setup["tx"], OPTIM, LOSS, temperature=TEMPERATURE)  # donates `state`
    state, _ = step(state, setup["batch"])
    ref = np.asarray(reference(state.params, setup["collated"]))
    np.testing.assert_array_equal(ref, setup["current"])


def test_abstract_lora_state_holds_moments_for_the_adapters_only(setup):
    tx = ts.make_optimizer(OPTIM)
    graphdef, abstract = ts.abstract_train_state(lambda: lora_lib.apply_lora(_factory()(), LORA), tx)
    _, state = _lora_state(tx, trained_b=False)
    assert jax.tree.structure(abstract) == jax.tree.structure(state)
    assert [x.shape for x in jax.tree.leaves(abstract)] == [x.shape for x in jax.tree.leaves(state)]
