"""Sampling against NumPy: filtering sets, log-prob definition, empirical distribution."""

import jax
import numpy as np
import pytest

from intraskill_jax.rollout.sampling import accept_drafts, argmax, categorical, filter_logits, sample_tokens


def np_keep(logits, top_k, top_p):
    keep = np.ones_like(logits, bool)
    for b, row in enumerate(logits):
        if top_k:
            keep[b] &= row >= np.sort(row)[-top_k]
        masked = np.where(keep[b], row, -np.inf)
        p = np.exp(masked - masked.max())
        p /= p.sum()
        order = np.argsort(-masked, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        nucleus = np.zeros_like(keep[b])
        nucleus[order[before < top_p]] = True
        keep[b] &= nucleus
    return keep


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (5, 1.0), (0, 0.7), (8, 0.5), (1, 1.0)])
def test_filter_keeps_exactly_the_numpy_set(top_k, top_p):
    logits = np.random.default_rng(0).normal(size=(4, 40)).astype(np.float32)
    kept = np.asarray(filter_logits(logits, top_k, top_p)) > np.finfo(np.float32).min
    np.testing.assert_array_equal(kept, np_keep(logits, top_k, top_p))


def test_logprob_is_temperature_scaled_before_filtering_and_greedy_at_zero():
    logits = np.random.default_rng(1).normal(size=(3, 30)).astype(np.float32) * 3
    tokens, lp = sample_tokens(logits, jax.random.key(0), 0.7, 0.9, 10)
    scaled = logits / 0.7
    ref = scaled - np.log(np.exp(scaled - scaled.max(1, keepdims=True)).sum(1, keepdims=True)) - scaled.max(1, keepdims=True)
    np.testing.assert_allclose(lp, ref[np.arange(3), np.asarray(tokens)], rtol=1e-5, atol=1e-5)
    assert np.all(np_keep(scaled, 10, 0.9)[np.arange(3), np.asarray(tokens)])
    g, glp = sample_tokens(logits, jax.random.key(0), 0.0, 1.0, 0)
    np.testing.assert_array_equal(g, logits.argmax(1))
    ref1 = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    np.testing.assert_allclose(glp, ref1[np.arange(3), logits.argmax(1)], rtol=1e-5, atol=1e-5)


def test_samples_follow_the_softmax():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    keys = jax.random.split(jax.random.key(3), 4000)
    toks = np.asarray(jax.vmap(lambda k: sample_tokens(logits, k, 1.0, 1.0, 0)[0][0])(keys))
    freq = np.bincount(toks, minlength=4) / len(toks)
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.03)
    toks = np.asarray(jax.vmap(lambda k: sample_tokens(logits, k, 1.0, 0.75, 0)[0][0])(keys))
    assert set(np.unique(toks)) == {0, 1}  # nucleus 0.75 keeps the top two tokens


def test_argmax_is_numpys_first_maximum():
    logits = np.random.default_rng(4).integers(0, 5, size=(64, 300)).astype(np.float32)  # many ties
    np.testing.assert_array_equal(argmax(logits), logits.argmax(1))


def test_two_level_inversion_matches_the_whole_cdf_and_skips_masked_tokens():
    # 1,000 tokens: eight blocks of 128, the last one partial; a third of the vocabulary masked.
    rng = np.random.default_rng(5)
    logits = (rng.normal(size=(512, 1000)) * 2).astype(np.float32)
    logits[rng.random(logits.shape) < 1 / 3] = np.finfo(np.float32).min
    key = jax.random.key(6)
    toks = np.asarray(categorical(key, logits))
    p = np.exp(logits.astype(np.float64) - logits.max(1, keepdims=True))
    cdf = np.cumsum(p, axis=1)
    u = np.asarray(jax.random.uniform(key, (512,), np.float32), np.float64) * cdf[:, -1]
    ref = np.array([np.searchsorted(c, x, side="right") for c, x in zip(cdf, u)])
    assert np.mean(toks == ref) >= 0.99  # float32 against float64 may differ at a boundary
    assert np.all(logits[np.arange(512), toks] > np.finfo(np.float32).min)


def test_samples_over_many_blocks_follow_the_softmax():
    probs = np.random.default_rng(7).dirichlet(np.full(300, 0.3))
    logits = np.log(np.maximum(probs, 1e-30))[None].astype(np.float32)
    keys = jax.random.split(jax.random.key(8), 20000)
    toks = np.asarray(jax.vmap(lambda k: categorical(k, logits)[0])(keys))
    freq = np.bincount(toks, minlength=300) / len(toks)
    big = probs > 0.01
    np.testing.assert_allclose(freq[big], probs[big], atol=0.012)
    assert abs(freq[~big].sum() - probs[~big].sum()) < 0.015


@pytest.mark.parametrize("top_k, top_p, temperature", [(0, 1.0, 1.0), (0, 0.8, 1.2), (3, 1.0, 0.7)])
def test_a_draft_kept_with_its_probability_else_a_draw_without_it_follows_the_filtered_softmax(top_k, top_p,
                                                                                             temperature):
    """Speculative sampling with a one-token draft: every draft (the likeliest, a rare one, one the
    filter removes) yields tokens distributed as a plain draw, and its log-prob is the plain one."""
    rng = np.random.default_rng(4)
    logits = rng.normal(size=6).astype(np.float32) * 1.5
    scaled = logits / temperature
    keep = np_keep(scaled[None], top_k, top_p)[0]
    assert keep.sum() > 1  # a rejected draft leaves tokens to draw
    target = np.where(keep, np.exp(scaled - scaled.max()), 0.0)
    target /= target.sum()
    n = 40000
    rows = np.broadcast_to(logits, (n, 6))
    for draft in (int(np.argmax(logits)), int(np.argsort(logits)[1]), int(np.argmin(np.where(keep, 9.0, scaled)))):
        drafts = np.full(n, draft, np.int32)
        kept, lp = accept_drafts(rows, drafts, jax.random.key(draft), temperature, top_p, top_k)
        redrawn, _ = sample_tokens(rows, jax.random.key(10 + draft), temperature, top_p, top_k, exclude=drafts)
        tokens = np.where(np.asarray(kept), draft, np.asarray(redrawn))
        np.testing.assert_allclose(np.bincount(tokens, minlength=6) / n, target, atol=0.01)
        assert np.mean(np.asarray(kept)) == pytest.approx(target[draft], abs=0.01)
        assert not np.any(np.asarray(redrawn)[~np.asarray(kept)] == draft)
        full = scaled - scaled.max() - np.log(np.exp(scaled - scaled.max()).sum())
        np.testing.assert_allclose(np.asarray(lp), full[draft], rtol=1e-5, atol=1e-5)


def test_a_greedy_draft_is_kept_exactly_where_it_is_the_maximum():
    logits = np.random.default_rng(5).normal(size=(8, 30)).astype(np.float32)
    drafts = np.where(np.arange(8) % 2 == 0, logits.argmax(1), (logits.argmax(1) + 1) % 30).astype(np.int32)
    kept, lp = accept_drafts(logits, drafts, jax.random.key(0), 0.0, 1.0, 0)
    np.testing.assert_array_equal(kept, np.arange(8) % 2 == 0)
    ref = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    np.testing.assert_allclose(lp, ref[np.arange(8), drafts], rtol=1e-5, atol=1e-5)
    # A greedy row ignores `exclude`: its maximum is never the rejected draft.
    np.testing.assert_array_equal(sample_tokens(logits, jax.random.key(0), 0.0, 1.0, 0, exclude=drafts)[0],
                                  logits.argmax(1))
