"""The embedded sampler against the model run without a cache (the second implementation)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from intraskill_jax.models import causal_lm_class, token_logprobs
from intraskill_jax.models import layers
from intraskill_jax.models.cache import AttentionCache
from intraskill_jax.models.layers import Linear
from intraskill_jax.rollout.base import GenerateRequest, SamplingParams, WeightUpdate
from intraskill_jax.rollout import jax_sampler
from intraskill_jax.rollout.jax_sampler import JaxSampler

from tests.rollout.tiny_models import SMALL, make_model

STOP = 7


_FORWARDS = {}


def _forward(model):
    """The model without a cache, jitted once per model on right-padded [1, 192] inputs."""
    if id(model) not in _FORWARDS:
        graphdef, state = nnx.split(model)
        fn = jax.jit(lambda st, ids, mask: nnx.merge(graphdef, st)(ids, mask)[0])
        _FORWARDS[id(model)] = lambda ids, mask: fn(state, ids, mask)
    return _FORWARDS[id(model)]


def reference_logprobs(model, prompts, completions, temperature=1.0):
    """Each completion's token log-probs under `model` after its prompt, teacher-forced (what the
    trainer recomputes): all rows in one call, right-padded to a multiple of 64 tokens, jitted (an
    eager call per row took ~4 s)."""
    seqs = [p + c for p, c in zip(prompts, completions, strict=True)]
    ids = np.zeros((len(seqs), -(-max(map(len, seqs)) // 64) * 64 + 1), np.int32)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    graphdef, state = nnx.split(model)
    lp = np.asarray(_logprobs(graphdef, state, jnp.asarray(ids), temperature))
    return [lp[i, len(p) - 1: len(p) - 1 + len(c)] for i, (p, c) in enumerate(zip(prompts, completions))]


@functools.partial(jax.jit, static_argnums=(0, 3))
def _logprobs(graphdef, state, ids, temperature):
    return token_logprobs(nnx.merge(graphdef, state), ids[:, :-1], ids[:, 1:], temperature=temperature)


def greedy_reference(model, ids, n, stop=STOP):
    """Greedy continuation by re-running the whole sequence each step (no cache)."""
    forward, ids, out = _forward(model), list(ids), []
    for _ in range(n):
        padded = np.zeros((1, 192), np.int32)
        padded[0, : len(ids)] = ids
        mask = (np.arange(192) < len(ids))[None].astype(np.int32)
        tok = int(jnp.argmax(forward(jnp.asarray(padded), jnp.asarray(mask))[len(ids) - 1]))
        out.append(tok)
        if tok == stop:
            break
        ids.append(tok)
    return out


def prompts(seed, n, lo=3, hi=40):
    rng = np.random.default_rng(seed)
    return [rng.integers(10, 300, rng.integers(lo, hi)).tolist() for _ in range(n)]


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3", "llama"])
def model(request):
    yield make_model(request.param)
    jax.clear_caches()  # a family's programs, not needed again (`conftest.release_compiled_programs`)



def small(**kw):
    return dataclasses.replace(SMALL, **kw)


def variant(model, **changes):
    """`model`'s parameters in a model whose config has `changes` (remat, kernel choices)."""
    cfg = model.config.replace(**changes)
    other = causal_lm_class(cfg)(cfg, rngs=nnx.Rngs(0))
    nnx.update(other, nnx.state(model, nnx.Param))
    return other


def assert_greedy_as_reference(sampled_model, model, seed):
    """Greedy completions of `sampled_model`'s sampler equal `model`'s uncached reference."""
    ps = prompts(seed, 2)
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(STOP,))
    got = JaxSampler(sampled_model, small()).generate([GenerateRequest(f"s{i}", p) for i, p in enumerate(ps)], params)
    for p, c in zip(ps, got, strict=True):
        assert c.token_ids == greedy_reference(model, p, 12)


def test_batched_greedy_equals_uncached_reference(model):
    sampler = JaxSampler(model, small())
    ps = prompts(0, 3)
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(STOP,))
    got = sampler.generate([GenerateRequest(f"s{i}", p) for i, p in enumerate(ps)], params)
    for p, c in zip(ps, got, strict=True):
        assert c.token_ids == greedy_reference(model, p, 12)
        assert c.finish_reason == ("stop" if c.token_ids[-1] == STOP else "length")


def test_a_model_with_remat_samples_as_the_model_without(model):
    # The trainer's model carries its remat policy (the study's policy.remat='full') into the sampler,
    # whose decode loop could not trace it (TraceContextError) before sampling skipped remat.
    assert_greedy_as_reference(variant(model, remat="full"), model, 4)


def test_a_model_with_scan_layers_samples_as_the_model_without(model):
    # The study's configs scan their layers (policy.scan_layers=True) for training only; the
    # sampler's cached prefill and decode run them unrolled.
    assert_greedy_as_reference(variant(model, scan_layers=True, remat="full"), model, 5)


@pytest.mark.parametrize("rows_at_once", ["all", "one"])
def test_a_model_reading_its_cache_in_blocks_samples_as_the_model_without(model, rows_at_once, monkeypatch):
    # The CPU configs read the decode cache in blocks up to the last slot in use
    # (policy.cache_block_size); 24 and 20 do not divide the 160-slot cache, so the last block
    # overhangs. A turn's prefill takes the rows all at once or, with the scores' budget at one
    # byte, one at a time (a block size of its own: programs are cached per model structure).
    if rows_at_once == "one":
        monkeypatch.setattr(layers, "CACHE_BLOCK_SCORE_BYTES", 1)
    sampler = JaxSampler(variant(model, cache_block_size=24 if rows_at_once == "all" else 20), small())
    params = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(STOP,))
    history = dict(zip("AB", prompts(6, 2, 10, 30), strict=True))
    for turn in range(4):
        sessions = ["A"] if turn == 2 else ["A", "B"]  # B idles a turn: its row is masked, not read
        for s, c in zip(sessions, sampler.generate([GenerateRequest(s, history[s]) for s in sessions], params),
                        strict=True):
            assert c.token_ids == greedy_reference(model, history[s], 8), (turn, s)
            history[s] = history[s] + c.token_ids + list(range(50, 50 + 5 * turn))


def test_a_model_decoding_with_transposed_weights_samples_as_the_model_without(model):
    # The CPU configs decode with [in, out] copies of the weights (policy.transpose_decode_weights):
    # the same tokens and, at temperature 1, the same log-probs.
    transposed = variant(model, transpose_decode_weights=True)
    assert_greedy_as_reference(transposed, model, 7)
    sampled = SamplingParams(temperature=1.0, max_new_tokens=12)
    requests = [GenerateRequest(f"s{i}", p) for i, p in enumerate(prompts(8, 3))]
    want = JaxSampler(model, small()).generate(requests, sampled)
    for w, c in zip(want, JaxSampler(transposed, small()).generate(requests, sampled), strict=True):
        assert c.token_ids == w.token_ids
        np.testing.assert_allclose(c.logprobs, w.logprobs, rtol=1e-5, atol=1e-5)
    # The copies live in the sampler's own split; the model it was given (the learner's) gains none.
    assert transposed.output_embedding_t is None
    assert all(m.weight_t is None for _, m in nnx.iter_modules(transposed) if isinstance(m, Linear))


@pytest.mark.parametrize("cache_block_size", [0, 16])
def test_a_sampler_with_bfloat16_weights_samples_as_a_bfloat16_copy_of_the_model(model, cache_block_size):
    """sampler.weight_dtype='bfloat16' over a float32 policy: the sampler multiplies by bfloat16 copies
    (float32 activations and cache), so its greedy tokens are those of the policy with its weights
    rounded to bfloat16, run without a cache; its log-probs stay near the float32 policy's (what the
    trainer scores), and the policy it was given keeps its float32 weights. With the cache read in
    blocks, a pre-fill's products over it round to bfloat16 only where this backend runs them
    (`bfloat16_cache_products`); XLA:CPU on an AMD Zen 4 (AVX512-BF16, no AMX) failed on them."""
    from intraskill_jax.models.layers import Attention, matmul_dtype
    from intraskill_jax.rollout.jax_sampler import bfloat16_cache_products, for_sampling

    policy = variant(model, cache_block_size=cache_block_size) if cache_block_size else model
    sampler = JaxSampler(policy, small(weight_dtype="bfloat16"))
    kinds = {v.dtype for v in jax.tree.leaves(sampler.state)}
    assert jnp.dtype(jnp.bfloat16) in kinds and sampler.model_config.compute_dtype == jnp.float32
    assert {v.dtype for v in jax.tree.leaves(nnx.state(model, nnx.Param))} == {jnp.dtype(jnp.float32)}
    assert matmul_dtype(jnp.float32, jnp.bfloat16) == jnp.bfloat16 and matmul_dtype(jnp.float32, jnp.float32) == jnp.float32
    rounded_products = bfloat16_cache_products()
    attention = [m for _, m in nnx.iter_modules(for_sampling(policy, "bfloat16")) if isinstance(m, Attention)]
    assert {m.cache_product_dtype for m in attention} == {jnp.dtype(jnp.bfloat16 if rounded_products else jnp.float32)}

    rounded = variant(model, param_dtype="bfloat16")
    nnx.update(rounded, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model, nnx.Param)))
    ps = prompts(11, 2)
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(STOP,))
    got = sampler.generate([GenerateRequest(f"s{i}", p) for i, p in enumerate(ps)], params)
    assert sampler._cache.layers[-1].key.dtype == jnp.float32  # every tiny model ends on an attention layer
    got += sampler.generate([GenerateRequest(f"s{i}", p + c.token_ids + [7, 8, 9]) for i, (p, c) in
                             enumerate(zip(ps, got))], params)  # a second turn: a pre-fill over the cache
    ps += [p + c.token_ids + [7, 8, 9] for p, c in zip(ps, got)]
    exact = reference_logprobs(model, ps, [c.token_ids for c in got])
    for p, c, lp in zip(ps, got, exact, strict=True):
        if not (cache_block_size and rounded_products):  # bfloat16 queries and keys may part near-ties
            assert c.token_ids == greedy_reference(rounded, p, 12)
        np.testing.assert_allclose(c.logprobs, lp, atol=0.05)


# /proc/cpuinfo's flags lines of the machines the CPU figures were measured on (abridged).
INTEL_AMX_FLAGS = "fpu vme sse sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 amx_bf16 amx_tile amx_int8"
AMD_AVX2_FLAGS = "fpu vme sse sse2 avx avx2 fma sha_ni"
AMD_ZEN4_FLAGS = "fpu vme sse sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16"


@pytest.mark.parametrize("flags, native", [(INTEL_AMX_FLAGS, True), (AMD_AVX2_FLAGS, False),
                                           (AMD_ZEN4_FLAGS, True), ("", False)])
def test_native_bfloat16_products_reads_the_cpus_flags(tmp_path, flags, native):
    from intraskill_jax.rollout.jax_sampler import native_bfloat16_products

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: x\nflags\t\t: {flags}\nbogomips\t: 4890\n\n"
                       f"processor\t: 1\nflags\t\t: {flags}\n")
    assert native_bfloat16_products(str(cpuinfo)) is native
    assert native_bfloat16_products(str(tmp_path / "absent")) is False  # not Linux: the policy's own weights


@pytest.mark.parametrize("flags, runs", [(INTEL_AMX_FLAGS, True), (AMD_ZEN4_FLAGS, False), (AMD_AVX2_FLAGS, False)])
def test_bfloat16_cache_products_only_where_xla_cpu_runs_them(tmp_path, flags, runs):
    from intraskill_jax.rollout.jax_sampler import bfloat16_cache_products, native_bfloat16_products

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert bfloat16_cache_products(str(cpuinfo)) is runs
    # Zen 4: bfloat16 weights, float32 cache products
    assert native_bfloat16_products(str(cpuinfo)) is (flags != AMD_AVX2_FLAGS)
    assert bfloat16_cache_products(str(tmp_path / "absent")) is False


@pytest.mark.parametrize("native", [True, False])
def test_bfloat16_if_native_holds_bfloat16_copies_only_where_the_cpu_multiplies_them(model, monkeypatch, native):
    from intraskill_jax.rollout import jax_sampler

    monkeypatch.setattr(jax_sampler, "native_bfloat16_products", lambda: native)
    sampler = JaxSampler(model, small(weight_dtype="bfloat16_if_native"))
    assert (jnp.dtype(jnp.bfloat16) in {v.dtype for v in jax.tree.leaves(sampler.state)}) is native
    assert jnp.dtype(sampler.model_config.param_dtype) == jnp.dtype(jnp.bfloat16 if native else jnp.float32)
    with pytest.raises(ValueError, match="bfloat16_if_native"):
        small(weight_dtype="bf16")


def test_logprobs_equal_what_the_trainer_recomputes(model):
    sampler = JaxSampler(model, small(seed=3))
    ps = prompts(1, 2)
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=10)
    got = sampler.generate([GenerateRequest(f"s{i}", p) for i, p in enumerate(ps)], params)
    for c, lp in zip(got, reference_logprobs(model, ps, [c.token_ids for c in got], 0.7), strict=True):
        np.testing.assert_allclose(c.logprobs, lp, rtol=1e-4, atol=1e-4)


def test_multi_turn_reuses_the_cache_and_matches_a_fresh_session(model):
    params = SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(STOP,))
    a, b = prompts(2, 2)
    sampler = JaxSampler(model, small())
    history = {"A": a, "B": b}
    for turn in range(3):
        # Turn 1 advances only A: B's row must stay untouched while idle.
        sessions = ["A"] if turn == 1 else ["A", "B"]
        got = sampler.generate([GenerateRequest(s, history[s]) for s in sessions], params)
        for s, c in zip(sessions, got, strict=True):
            assert c.token_ids == greedy_reference(model, history[s], 6), (turn, s)
            history[s] = history[s] + c.token_ids + [40 + turn, 41, 42 + turn]  # an observation
    # A session whose history diverged is rebuilt from scratch.
    c = sampler.generate([GenerateRequest("A", b[:5])], params)[0]
    assert c.token_ids == greedy_reference(model, b[:5], 6)


def test_rows_use_only_their_own_slots_and_overlong_sessions_are_refused(model):
    """Six turns of two sessions whose new tokens differ in length (so one row is padded at every
    prefill): each row holds exactly its history, the cache only grows to the longest session, and
    a session that cannot fit raises before any state changes."""
    sampler = JaxSampler(model, small())
    params = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(STOP,))
    history = {s: p for s, p in zip("AB", prompts(4, 2, 10, 20))}
    for turn in range(6):
        for s, c in zip("AB", sampler.generate([GenerateRequest(s, history[s]) for s in "AB"], params), strict=True):
            assert c.token_ids == greedy_reference(model, history[s], 8), (turn, s)
            history[s] = history[s] + c.token_ids + list(range(50, 53 + 4 * (s == "A")))
    lengths = np.asarray(sampler._cache.length)
    for s in "AB":
        row = sampler._rows[s]
        assert lengths[row.index] == len(row.cached) == int(np.asarray(sampler._cache.key_valid)[row.index].sum())
    assert sampler.cache_length <= 160
    with pytest.raises(RuntimeError, match="max_length"):
        sampler.generate([GenerateRequest("A", history["A"] + [5] * 160)], params)
    c = sampler.generate([GenerateRequest("A", history["A"])], params)[0]  # nothing was lost
    assert c.token_ids == greedy_reference(model, history["A"], 8)


@pytest.mark.parametrize("segment", [0, 16])
def test_a_shared_prompt_prefix_is_prefilled_once_and_stays_exact(model, segment):
    sampler = JaxSampler(model, small(shared_prefix_slots=segment))
    common = prompts(6, 1, 20, 21)[0]
    ps = [common, common + [31, 32, 33], common + [34], common + [31, 32, 33]]
    params = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(STOP,))
    got = sampler.generate([GenerateRequest(f"s{i}", p) for i, p in enumerate(ps)], params)
    assert sampler.shared_prefix_tokens == 19 * 3  # every row keeps its last token for its logits
    for p, c in zip(ps, got, strict=True):
        assert c.token_ids == greedy_reference(model, p, 8)


def test_cache_grows_with_the_sessions_and_restarts_short(model):
    """The cache grows as the sessions do, its old buffers freed as they are copied; it is dropped
    once no session is left (its memory free for what runs between batches: a GRPO update) and
    starts over at the next request's length."""
    sampler = JaxSampler(model, small(min_cache_length=80))
    assert sampler.cache_length == 0  # none before a request
    params = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(STOP,))
    history = {s: p for s, p in zip("AB", prompts(5, 2, 10, 20))}
    lengths, outgrown = [], []
    for turn in range(4):
        before = sampler._cache
        for s, c in zip("AB", sampler.generate([GenerateRequest(s, history[s]) for s in "AB"], params), strict=True):
            assert c.token_ids == greedy_reference(model, history[s], 8), (turn, s)
            history[s] = history[s] + c.token_ids + list(range(50, 62))
        if before is not None and before.max_length < sampler.cache_length:
            outgrown.append(before)
        lengths.append(sampler.cache_length)
    assert lengths[0] == 80 and lengths[-1] == 160  # grown, rows kept
    assert outgrown and all(layer.key.is_deleted() and layer.value.is_deleted() for old in outgrown
                            for layer in old.layers if isinstance(layer, AttentionCache))
    sampler.release("A")
    assert sampler.cache_length == 160  # B still holds its row
    sampler.release("B")
    assert sampler.cache_length == 0
    c = sampler.generate([GenerateRequest("C", history["A"][:9])], params)[0]
    assert sampler.cache_length == 80 and c.token_ids == greedy_reference(model, history["A"][:9], 8)


def test_sessions_beyond_max_batch_and_release(model):
    sampler = JaxSampler(model, small())
    params = SamplingParams(temperature=0.0, max_new_tokens=2)
    sampler.generate([GenerateRequest(s, [11, 12]) for s in "abcd"], params)
    with pytest.raises(RuntimeError, match="max_batch"):
        sampler.generate([GenerateRequest("e", [14])], params)
    sampler.release("a")
    assert sampler.generate([GenerateRequest("e", [14])], params)[0].token_ids == greedy_reference(model, [14], 2, stop=-1)


def _cut_at_stop(tokens, stop):
    """`tokens` up to and including the first one in `stop`."""
    return tokens[: next((k + 1 for k, t in enumerate(tokens) if t in stop), len(tokens))]


def _some_step_leaves_at_most_half(lengths):
    """Some step after the first has at least one reply, and at most half of them, still going."""
    return any(1 <= sum(n > k for n in lengths) <= len(lengths) // 2 for k in range(1, max(lengths)))


def test_a_decode_call_goes_on_at_half_its_batch_as_rows_end(model):
    """With `decode_halvings=2`, 8 sessions whose replies end at different steps (the stop set is
    drawn from their own greedy continuations) go on at 4 and then 2 rows: every completion over
    two turns stays the uncached reference's, and with temperature every log-prob stays what the
    trainer recomputes for its own row."""
    ps = prompts(11, 8)
    free = [greedy_reference(model, p, 12, stop=-1) for p in ps]
    stop = tuple(f[k + 1] for k, f in enumerate(free[:5]))  # five rows end within 6 steps, the others may not
    ends = [len(_cut_at_stop(f, stop)) for f in free]
    assert _some_step_leaves_at_most_half(ends), ends
    params = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=stop)
    sampler = JaxSampler(model, small(max_batch=8, decode_halvings=2))
    history = {f"s{i}": p for i, p in enumerate(ps)}
    for turn in range(2):
        got = sampler.generate([GenerateRequest(s, h) for s, h in history.items()], params)
        for (s, h), c in zip(history.items(), got, strict=True):
            assert c.token_ids == _cut_at_stop(greedy_reference(model, h, 12, stop=-1), stop), (turn, s)
            history[s] = h + c.token_ids + [50 + turn, 51]

    sampled = JaxSampler(model, small(max_batch=8, decode_halvings=2, seed=5))
    # An eighth of the vocabulary stops a reply: sampled rows end at scattered steps.
    params = SamplingParams(temperature=0.7, max_new_tokens=12,
                            stop_token_ids=tuple(range(0, model.config.vocab_size, 8)))
    got = sampled.generate([GenerateRequest(f"t{i}", p) for i, p in enumerate(ps)], params)
    ends = [len(c.token_ids) for c in got]
    assert _some_step_leaves_at_most_half(ends), ends
    for c, lp in zip(got, reference_logprobs(model, ps, [c.token_ids for c in got], 0.7), strict=True):
        np.testing.assert_allclose(c.logprobs, lp, rtol=1e-4, atol=1e-4)


def test_a_turn_of_few_sessions_runs_on_their_rows_alone(model, monkeypatch):
    """Turns of 3 or 1 of 5 live sessions in an 8-row cache run at batch 4 and 2 on the gathered
    rows (an idle live row fills the spare place and must come back untouched); every session's
    completions stay the uncached reference's."""
    import intraskill_jax.rollout.jax_sampler as js

    widths = []
    take = js._take_rows
    monkeypatch.setattr(js, "_take_rows", lambda cache, rows: widths.append(len(rows)) or take(cache, rows))
    sampler = JaxSampler(model, small(max_batch=8))
    assert [sampler._row_bucket(n) for n in (1, 2, 3, 4, 5, 8)] == [2, 2, 4, 4, 8, 8]
    params = SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(STOP,))
    history = dict(zip("ABCDE", prompts(7, 5)))
    for turn, sessions in enumerate(["ABCDE", "ECA", "D", "ABCDE"]):
        got = sampler.generate([GenerateRequest(s, history[s]) for s in sessions], params)
        for s, c in zip(sessions, got, strict=True):
            assert c.token_ids == greedy_reference(model, history[s], 6), (turn, s)
            history[s] = history[s] + c.token_ids + [60 + turn, 61]
    assert widths == [4, 2]


@pytest.mark.parametrize("segment", [0, 16])
def test_a_session_starting_later_on_a_kept_prefix_copies_its_state(model, segment):
    """Three sessions start together on a common prefix (pre-filled once and kept); sessions that
    start alone later on it copy its state in, also after the cache restarted at another length; one
    starting elsewhere pre-fills everything. Every completion stays the uncached reference's, also
    where the prefix's first 16 tokens are held in a shared segment."""
    sampler = JaxSampler(model, small(min_cache_length=64, shared_prefix_slots=segment))
    common = prompts(8, 1, 24, 25)[0]
    params = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(STOP,))

    def turn(session, ids):
        c = sampler.generate([GenerateRequest(session, ids)], params)[0]
        assert c.token_ids == greedy_reference(model, ids, 8), session

    got = sampler.generate([GenerateRequest(s, common + [30 + k]) for k, s in enumerate("ABC")], params)
    for k, c in enumerate(got):
        assert c.token_ids == greedy_reference(model, common + [30 + k], 8)
    assert sampler.shared_prefix_tokens == 24 * 2
    sampler.release("A")
    turn("D", common + [40, 41])  # alone, on the kept prefix
    assert sampler.shared_prefix_tokens == 24 * 3
    turn("E", prompts(9, 1, 30, 31)[0])  # elsewhere: nothing copied
    assert sampler.shared_prefix_tokens == 24 * 3
    for s in "BCDE":
        sampler.release(s)
    turn("F", common + [50] * 100)  # a fresh cache, longer than the one the prefix was kept at
    # (its own slots: the 125 tokens and 8 new, but those in the segment)
    assert sampler.cache_length == (160 if not segment else 128) and sampler.shared_prefix_tokens == 24 * 4
    sampler.release("F")
    turn("G", common + [60])  # and a shorter one again: the kept state is cut to it
    assert sampler.cache_length == 64 and sampler.shared_prefix_tokens == 24 * 5


def test_a_long_new_history_is_prefilled_apart_and_siblings_share_it(model, monkeypatch):
    """Two groups of two siblings start on prompts of their own past a common prefix: each group's
    head is pre-filled once, apart, and copied to its sibling. Then three sessions add an
    observation each while a fourth starts on a long prompt of its own: its head is pre-filled
    apart, so the turn's batched pre-fill stays at the width the short rows need. Every completion
    stays the uncached reference's."""
    import intraskill_jax.rollout.jax_sampler as js

    widths = []
    batched = js.prefill
    monkeypatch.setattr(js, "prefill", lambda g, s, cache, ids, mask, *shared: widths.append(ids.shape) or batched(g, s, cache, ids, mask, *shared))
    sampler = JaxSampler(model, small(apart_call_cost=16))
    params = SamplingParams(temperature=0.0, max_new_tokens=6, stop_token_ids=(STOP,))
    common, a, b = prompts(10, 1, 10, 11)[0], prompts(11, 1, 40, 41)[0], prompts(12, 1, 40, 41)[0]
    history = {"A1": common + a, "A2": common + a, "B1": common + b, "B2": common + b}
    got = sampler.generate([GenerateRequest(s, h) for s, h in history.items()], params)
    for (s, h), c in zip(history.items(), got, strict=True):
        assert c.token_ids == greedy_reference(model, h, 6), s
        history[s] = h + c.token_ids + [60, 61, 62]
    # The 10-token prefix once; then of each group's 40 tokens all but the last 8, once per group.
    assert sampler.shared_prefix_tokens == 10 * 3 and sampler.apart_tokens == 2 * 32
    assert widths == [(4, 8)]
    sampler.release("B2")
    history["C"] = prompts(13, 1, 70, 71)[0]
    widths.clear()
    got = sampler.generate([GenerateRequest(s, h) for s, h in history.items() if s != "B2"], params)
    for s, c in zip([s for s in history if s != "B2"], got, strict=True):
        assert c.token_ids == greedy_reference(model, history[s], 6), s
    assert sampler.apart_tokens == 2 * 32 + 62 and widths == [(4, 8)]


@pytest.mark.parametrize("cache_block_size", [0, 16])
def test_a_shared_segment_holds_a_prefix_once_for_the_rows_that_attend_it(model, cache_block_size):
    """With `shared_prefix_slots`, three sessions starting on a common 30-token prefix attend its
    first 24 tokens in a segment held once (the other 5 shared ones are copied into their rows), and
    their rows hold only what follows; so does a session starting alone later on the kept prefix.
    While sessions attend the segment, two starting on a prefix of their own copy it into their
    rows (the segment stays), and two on a longer prefix that begins with the segment attend it and
    copy the rest. Once no session is live a new prefix replaces the segment; new weights drop it.
    Every completion stays the uncached reference's, with the cache read whole and in blocks."""
    sampled = variant(model, cache_block_size=cache_block_size) if cache_block_size else model
    sampler = JaxSampler(sampled, small(shared_prefix_slots=24, min_cache_length=32))
    params = SamplingParams(temperature=0.0, max_new_tokens=8, stop_token_ids=(STOP,))
    history = {}

    def turn(sessions):
        got = sampler.generate([GenerateRequest(s, history[s]) for s in sessions], params)
        for s, c in zip(sessions, got, strict=True):
            assert c.token_ids == greedy_reference(model, history[s], 8), s
            history[s] = history[s] + c.token_ids + [60, 61, 62]

    def attends(*sessions):
        return [sampler._rows[s].shared for s in sessions]

    common, other = prompts(20, 1, 30, 31)[0], prompts(21, 1, 30, 31)[0]
    history.update(A=common + [30], B=common + [31, 32], C=common + [33])
    turn("ABC")
    assert sampler._segment[0] == common[:24] and attends("A", "B", "C") == [24] * 3
    own = np.asarray(sampler._cache.length)
    for s in "ABC":  # a row's own slots hold its history past the segment
        assert own[sampler._rows[s].index] == len(sampler._rows[s].cached) - 24
    turn("AB")
    sampler.release("C")
    history["D"] = common + [34, 35]
    turn("D")  # alone, on the kept prefix: its state (the segment attended, the rest) copied in
    assert attends("D") == [24]
    sampler.release("D")
    history.update(E=other + [36], F=other + [37])
    turn("EF")  # A and B attend the segment: this prefix is copied into the new rows
    assert sampler._segment[0] == common[:24] and attends("E", "F") == [0, 0]
    turn("ABEF")
    for s in "EF":
        sampler.release(s)
    history.update(G=common + [40] * 6 + [41], H=common + [40] * 6 + [42])
    turn("GH")  # begins with the segment: attends it, the 12 tokens after it copied
    assert sampler._segment[0] == common[:24] and attends("G", "H") == [24, 24]
    turn("ABGH")
    for s in "ABGH":
        sampler.release(s)
    history.update(I=other + [43], J=other + [44])
    turn("IJ")  # nothing attends the old segment: replaced
    assert sampler._segment[0] == other[:24] and attends("I", "J") == [24, 24]
    sampler.update_weights(WeightUpdate(version=1, load_model=lambda: sampled, publish=lambda: ""))
    assert sampler._segment[0] == []
    history["K"] = other + [45]
    turn("K")


def _prompt_lookup_reference(history, k, match=3):
    """`prompt_lookup` for one row in plain Python: the latest earlier occurrence of the longest
    suffix (match tokens down to one), its continuation repeated with its period."""
    last = len(history) - 1
    for n in range(match, 0, -1):
        if last - n + 1 < 0:
            continue
        suffix = history[last - n + 1:]
        ends = [p for p in range(n - 1, last) if history[p - n + 1: p + 1] == suffix]
        if ends:
            p = ends[-1]
            return [history[p + 1 + j % (last - p)] for j in range(k)]
    return [history[last]] * k


def test_prompt_lookup_drafts_as_a_python_reference():
    rng = np.random.default_rng(0)
    # Short alphabets repeat, so matches of every length (and none) occur; lengths from 1 to 40.
    rows = [rng.integers(0, a, n).tolist() for a, n in [(3, 40), (5, 23), (40, 12), (2, 1), (6, 2), (4, 31),
                                                      (50, 30), (3, 5)]]
    history = np.full((len(rows), 48), -5, np.int32)  # the room after each row's history holds junk
    for i, r in enumerate(rows):
        history[i, :len(r)] = r
    lengths = np.asarray([len(r) for r in rows], np.int32)
    for k in (1, 3, 6):
        got = np.asarray(jax_sampler.prompt_lookup(jnp.asarray(history), jnp.asarray(lengths), k))
        assert got.tolist() == [_prompt_lookup_reference(r, k) for r in rows], k
    assert _prompt_lookup_reference([1, 2, 3, 9, 1, 2, 3], 4) == [9, 1, 2, 3]
    assert _prompt_lookup_reference([5, 5], 3) == [5, 5, 5]


def _kept_drafts(reply_length, start, drafts, wrong):
    """How many drafted tokens a reply of `reply_length` tokens keeps when the draft for the token at
    absolute position q is the reply's own unless `wrong(q)`."""
    i = kept = 0
    while i < reply_length:
        i += 1  # the step's sampled token
        for _ in range(drafts):
            if i >= reply_length or wrong(start + i):
                break
            i, kept = i + 1, kept + 1
    return kept


def test_drafted_tokens_leave_every_reply_as_plain_decoding_gives_it(model, monkeypatch):
    """With `draft_tokens`, greedy replies over two turns (rows ending at different steps, the decode
    call halving its batch) are token for token the uncached reference's, and a step keeps exactly
    the drafted tokens that match: drafts read from the reference with every fourth position wrong.
    So are sampled replies drawn from the top token alone (the sampled acceptance path), whose
    log-probs at the temperature stay what the trainer recomputes. The prompt-lookup drafts give
    the same replies. A model with DeltaNet layers is refused."""
    config = small(max_batch=4, decode_halvings=1, draft_tokens=2)
    if "linear_attention" in model.config.layer_types:  # Qwen3.5
        with pytest.raises(ValueError, match="attention-only"):
            JaxSampler(model, config)
        return
    ps = prompts(21, 4)
    stop = (greedy_reference(model, ps[0], 12, stop=-1)[3], STOP)  # the first row ends early
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=stop)
    top_one = SamplingParams(temperature=0.7, top_k=1, max_new_tokens=12, stop_token_ids=stop)
    current = {}  # session -> its history, then the model's greedy continuation: what the oracle drafts from

    def play(sampler, params, oracle=False):
        """Two turns of the four sessions, each reply checked against the reference; with the oracle's
        drafts also the drafted tokens kept."""
        history = {f"s{i}": p for i, p in enumerate(ps)}
        for turn in range(2):
            # The oracle drafts what the model says after a reply's end too (past a stop, past
            # max_new): none of it may be emitted.
            free = {s: greedy_reference(model, h, 14, stop=-1) for s, h in history.items()}
            refs = {s: _cut_at_stop(f[:12], stop) for s, f in free.items()}
            current.clear()
            current.update({s: h + free[s] for s, h in history.items()})
            before = sampler.drafted_tokens_kept
            got = sampler.generate([GenerateRequest(s, h) for s, h in history.items()], params)
            assert [c.token_ids for c in got] == list(refs.values()), turn
            if params.temperature > 0:
                for c, lp in zip(got, reference_logprobs(model, list(history.values()), list(refs.values()),
                                                         params.temperature), strict=True):
                    np.testing.assert_allclose(c.logprobs, lp, rtol=1e-4, atol=1e-4)
            if oracle:
                kept = sum(_kept_drafts(len(refs[s]), len(h), 2, lambda q: q % 4 == 1) for s, h in history.items())
                assert sampler.drafted_tokens_kept - before == kept > 0, turn
            history = {s: h + refs[s] + [60 + turn, 61] for s, h in history.items()}

    play(JaxSampler(model, config), greedy)  # the prompt-lookup drafts

    def drafts(history, length, k):
        """The oracle's drafts for the rows of a decode step, in Python: a row is known by its
        history, a prefix of one session's (rows move when a decode call halves its batch)."""
        out = np.zeros((len(length), k), np.int32)
        for r, n in enumerate(np.asarray(length)):
            for full in current.values():
                if n <= len(full) and list(np.asarray(history)[r, :n]) == full[:n]:
                    ahead = (full + [0] * k)[n: n + k]
                    out[r] = [(t + 1) % model.config.vocab_size if (n + j) % 4 == 1 else t for j, t in enumerate(ahead)]
        return out

    monkeypatch.setattr(jax_sampler, "prompt_lookup", lambda history, length, k: jax.pure_callback(
        functools.partial(drafts, k=k), jax.ShapeDtypeStruct((length.shape[0], k), jnp.int32), history, length))
    jax.clear_caches()  # decode is traced again, with the oracle
    try:
        play(JaxSampler(model, config), greedy, oracle=True)
        play(JaxSampler(model, dataclasses.replace(config, seed=4)), top_one, oracle=True)
    finally:
        jax.clear_caches()  # no later test gets the oracle's program
