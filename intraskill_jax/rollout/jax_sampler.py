"""The embedded JAX sampler: batched prefill and decode over the models' cache, kept across turns.

Each session (an episode) owns one row of a shared `DecodeCache`. A request's token history is
compared with what its row already holds, so a new turn pre-fills only the tokens it adds (the
last sampled token and the observation). All rows advance in lockstep; rows without work in a call
are fully masked, which leaves their DeltaNet, conv and KV state untouched. A call whose sessions
fit half the rows or less runs on their rows alone, gathered into a smaller batch (halved down to a
quarter of max_batch) and put back after, so idle rows cost nothing. Each call's new tokens
are left-padded to a bucketed length and decode runs in one jitted `while_loop` of a bucketed
number of steps, so jit compiles a handful of programs, not one per turn.

New sessions whose prompts share a prefix (the system prompt and tools of every episode; the whole
prompt of GRPO siblings) pre-fill it once, in one row at batch 1, and copy that row's state to the
others; each then pre-fills only its own remainder (`shared_prefix_tokens` counts the tokens saved).
The last such prefix's state is kept, so a session that starts later on it (continuous batching:
an evaluation's next task under the same system prompt and skill) copies it in too. With
`shared_prefix_slots`, the prefix's keys and values are not copied into each row at all: they are
held once, in a segment of that many slots that every row on it attends before its own slots
(`models.layers.SharedKV`), so a decode step reads them once for all rows, not once per row, and
the rows' own slots hold only what follows. A new prefix replaces the segment only when no live
session attends it; until then it is copied as above (after the segment, where it extends it).

A session starting on a prompt of its own (the gate's random skill masks) beside sessions that add
one observation each would set the width of the whole turn's pre-fill: its head is pre-filled
apart, at batch 1 (once for siblings with the same prompt), where that computes fewer token
columns. State is copied between rows one row at a time in place (a scatter made XLA:CPU rewrite
the whole cache).

With `draft_tokens` (attention-only models), each decode step also feeds tokens drafted from the
row's own history (prompt lookup: what followed the last occurrence of its latest tokens), keeps
those the model agrees with, and gives back the slots of the others: a step yields several tokens
where a reply copies the session (a tool call's frame, a product id, an option's value).

Each row writes only its own real tokens at its own next slots (padding and idle rows cost none),
so the cache needs as many slots as the longest live session. Attention reads every slot (with the
model's `cache_block_size`, the blocks up to the last slot in use), so the cache starts short and
grows with the sessions (each length compiles its own programs); once no session is live it starts
over, short. A session longer than `max_length` is an error.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from intraskill_jax.models.cache import AttentionCache, DecodeCache, DeltaNetCache, init_cache
from intraskill_jax.rollout.base import Completion, GenerateRequest, SamplingParams, WeightUpdate
from intraskill_jax.rollout.sampling import accept_drafts, sample_tokens

log = logging.getLogger(__name__)


WEIGHT_DTYPES = ("auto", "float32", "bfloat16", "bfloat16_if_native")  # SamplerConfig.weight_dtype's values


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplerConfig:
    """Attributes:
      max_batch: cache rows = sessions served at once.
      max_length: cache slots per row: the longest session (prompt, turns) plus max_new_tokens.
      min_cache_length: the cache's first size; it grows up to max_length as sessions grow.
      cache_growth: factor between successive cache sizes (rounded up to multiples of 128). Each
        size compiles its own programs; a smaller factor keeps the cache, whose every slot
        attention reads at each step, closer to the sessions' length.
      prefill_buckets: new-token counts per call are padded up to one of these; longer inputs are
        pre-filled in chunks of the largest.
      decode_buckets: decode loops are compiled for these step counts (>= max_new_tokens).
      weight_dtype: the dtype of the sampler's weights: 'auto' (the policy's own), 'float32',
        'bfloat16', or 'bfloat16_if_native': bfloat16 where this backend multiplies bfloat16 in
        hardware (an accelerator, or a CPU with AVX512-BF16 or AMX), else the policy's own. A
        bfloat16 sampler of a float32 policy holds bfloat16 copies of the weights (made once per
        weight version) and multiplies in bfloat16 with float32 accumulation, its activations and
        cache in the policy's dtype (`models.layers.matmul_dtype`): on a CPU with AVX512-BF16 and
        AMX its products run ~2x faster, on one with AVX2 alone slower (the SmolLM2 run's episodes
        took 1.22x as long on an AMD EPYC with AVX2). Its log-probs then differ slightly from the
        trainer's, which the GRPO loss's truncated importance sampling corrects (`loss.tis_cap`).
      apart_call_cost: what a pre-fill call apart from the turn's batch costs beyond its tokens, in
        token columns: a long new history's head is pre-filled apart only where that saves more.
      shared_prefix_slots: the size of the segment holding a prefix the sessions share, attended by
        each of them and held once (0: none; a shared prefix's state is copied into each row).
        Longer prefixes keep their first this many tokens there, the rest in the rows.
      draft_tokens: tokens drafted from each row's own history that a decode step checks beside
        its sampled one (0: off; `decode`, `prompt_lookup`): a step then yields up to this many
        more tokens, each distributed as in plain decoding (greedy replies token for token the
        same). Attention-only models. With 4, 16 greedy episodes of SmolLM2 played 1.3-1.5x as
        fast on a 2-core CPU (docs/performance.md); each drafted token makes a step dearer.
      decode_halvings: how many times a decode call may halve its batch, going on with the rows
        still generating once they are at most half of it (`decode`): for backends where a step's
        cost follows its rows (a CPU); each halving compiles one more loop into the program.
    """

    max_batch: int = 16
    max_length: int = 16384
    min_cache_length: int = 1024
    cache_growth: float = 2.0
    prefill_buckets: tuple[int, ...] = (32, 128, 512, 2048)
    decode_buckets: tuple[int, ...] = (64, 256, 1024)
    seed: int = 0
    weight_dtype: Literal["auto", "float32", "bfloat16", "bfloat16_if_native"] = "auto"
    apart_call_cost: int = 64
    shared_prefix_slots: int = 0
    decode_halvings: int = 0
    draft_tokens: int = 0

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_length < 2 or self.min_cache_length < 1 or not self.cache_growth > 1:
            raise ValueError("need max_batch >= 1, max_length >= 2, min_cache_length >= 1 and cache_growth > 1, got "
                             f"{self.max_batch}, {self.max_length}, {self.min_cache_length}, {self.cache_growth}")
        if self.weight_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"sampler weight_dtype must be one of {', '.join(map(repr, WEIGHT_DTYPES))}, "
                             f"got {self.weight_dtype!r}")
        if min(self.apart_call_cost, self.shared_prefix_slots, self.decode_halvings, self.draft_tokens) < 0:
            raise ValueError("sampler apart_call_cost, shared_prefix_slots, decode_halvings and draft_tokens must be "
                             f">= 0, got {self.apart_call_cost}, {self.shared_prefix_slots}, {self.decode_halvings} "
                             f"and {self.draft_tokens}")
        for name in ("prefill_buckets", "decode_buckets"):
            b = getattr(self, name)
            if not b or list(b) != sorted(b) or b[0] < 1:
                raise ValueError(f"{name} must be increasing positive ints, got {b}")

    def sampler_weight_dtype(self) -> str | None:
        """The dtype the weights are held in (None: the policy's own), `bfloat16_if_native` resolved
        for this backend."""
        if self.weight_dtype == "bfloat16_if_native":
            return "bfloat16" if native_bfloat16_products() else None
        return None if self.weight_dtype == "auto" else self.weight_dtype

    def decode_steps(self, max_new_tokens: int) -> int:
        """Steps of the decode loop compiled for `max_new_tokens`: the smallest bucket holding it."""
        return _bucket(max_new_tokens, self.decode_buckets)


@dataclasses.dataclass
class _Row:
    index: int
    cached: list[int]  # tokens whose state is in the cache (the last sampled token is not fed)
    shared: int = 0  # of those, the first ones the row attends in the shared segment, not its own slots


def _bucket(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    return buckets[-1]


class JaxSampler:
    """A `RolloutEngine` over an NNX `CausalLM`."""

    collective = True  # its programs run over the devices the model's parameters live on

    def __init__(self, model: nnx.Module, config: SamplerConfig | None = None, *, weight_version: int = 0):
        self.config = config or SamplerConfig()
        self._use(model)
        self.weight_version = weight_version
        self.shared_prefix_tokens = 0  # tokens a row copied in instead of pre-filling them
        self.apart_tokens = 0  # tokens pre-filled apart from the turn's batch (`_heads_apart`)
        self.drafted_tokens_kept = 0  # sampled tokens that came from a draft (`draft_tokens`)
        self._rows: dict[str, _Row] = {}
        self._key = jax.random.key(self.config.seed)
        self.flush()

    @property
    def cache_length(self) -> int:
        """Slots the cache holds now (it grows from min_cache_length up to max_length)."""
        return 0 if self._cache is None else self._cache.max_length

    # -- weights -------------------------------------------------------------------------------

    def update_weights(self, weights: WeightUpdate) -> None:
        """Swaps in `weights.model()` in place (no export); cached sessions are dropped. The model may
        be of another architecture (an evaluation's second policy): the cache is rebuilt for it."""
        self._use(weights.model())
        self.weight_version = weights.version
        self.flush()

    def _use(self, model: nnx.Module) -> None:
        recurrent = sorted(set(model.config.layer_types) - {"full_attention"})
        if self.config.draft_tokens and recurrent:
            raise ValueError(f"sampler draft_tokens={self.config.draft_tokens} needs an attention-only model "
                             f"(Llama, Qwen3): this one has {', '.join(recurrent)} layers, whose state cannot "
                             "give back a rejected draft; set draft_tokens=0")
        sampling_model = for_sampling(model, self.config.sampler_weight_dtype())
        self.model_config = sampling_model.config  # the cache takes its dtype
        self.graphdef, self.state = nnx.split(sampling_model)

    def reseed(self, seed: int, step: int) -> None:
        """Restarts the sampler (no live sessions, rows handed out from 0, a fresh cache) with its
        stream at a key derived from (seed, step): a batch of episodes then depends only on that key
        and the weights, never on what ran before it, so a resumed run replays."""
        self.flush()
        self._key = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.config.seed), seed), step)

    def flush(self) -> None:
        # (tokens, a one-row cache holding their state, how many of them it attends in the segment)
        self._prefix = None
        # (tokens, a one-row cache of shared_prefix_slots holding them) or None: `_segment_for`
        self._segment = None if not self.config.shared_prefix_slots else (
            [], init_cache(self.model_config, 1, self.config.shared_prefix_slots))
        self._rows.clear()
        self._free = list(range(self.config.max_batch))  # rows handed out in order again: replayable
        self._cache = None  # made by the first request, for its length (`generate`)

    # -- RolloutEngine -------------------------------------------------------------------------

    def release(self, session: str) -> None:
        row = self._rows.pop(session, None)
        if row is not None:
            self._free.append(row.index)
        if not self._rows:  # nothing in it to keep: its memory is free until the next request (a GRPO update)
            self._cache = None

    def generate(self, requests: Sequence[GenerateRequest], params: SamplingParams) -> list[Completion]:
        if not requests:
            return []
        if len({r.session for r in requests}) != len(requests):
            raise ValueError("one request per session per call")
        steps = self.config.decode_steps(params.max_new_tokens)
        if params.max_new_tokens > steps:
            raise ValueError(f"max_new_tokens {params.max_new_tokens} exceeds the largest decode bucket {steps}")
        new_tokens: dict[int, list[int]] = {}
        fresh: list[int] = []
        for r in requests:
            ids = [int(t) for t in r.input_ids]
            if not ids:
                raise ValueError(f"session {r.session}: empty input_ids")
            row = self._rows.get(r.session)
            if row is not None and len(ids) > len(row.cached) and ids[: len(row.cached)] == row.cached:
                new_tokens[row.index] = ids[len(row.cached):]
            else:  # a new session, or a history that diverged from what the row holds
                if row is None:
                    if not self._free:
                        raise RuntimeError(
                            f"more than sampler.max_batch={self.config.max_batch} concurrent sessions; "
                            "release finished ones or raise max_batch")
                    row = self._rows[r.session] = _Row(self._free.pop(0), [])
                row.shared = 0
                fresh.append(row.index)
                new_tokens[row.index] = ids
            row.cached = ids
        prefix, shared = self._shared_prefix(new_tokens, fresh)
        starting = list(fresh)
        by_index = {row.index: row for row in self._rows.values()}
        segment = self._segment_for(prefix, starting) if prefix else 0
        reuse = []
        if prefix:
            for i in shared:
                by_index[i].shared = segment
        elif self._prefix is not None:  # sessions starting alone on the prefix an earlier call pre-filled
            known, n = self._prefix[0], len(self._prefix[0])
            reuse = [i for i in starting if len(new_tokens[i]) > n and new_tokens[i][:n] == known]
            for i in reuse:
                by_index[i].shared = self._prefix[2]
        # A row's slots hold its own history only (after the shared segment's), so the longest
        # session sets the cache size.
        # A decode step writes its drafted tokens past the reply's own slots before giving back the
        # ones not kept.
        need = (max(len(row.cached) - row.shared for row in (self._rows[r.session] for r in requests)) + steps
                + self.config.draft_tokens)
        if need > self.config.max_length:
            raise RuntimeError(
                f"a session needs {need} cache slots but sampler.max_length is {self.config.max_length}; "
                "raise max_length or lower agent.max_context_tokens")
        if not {row.index for row in self._rows.values()} - set(fresh):
            # Nothing in the cache is worth keeping: start over with the shortest cache that fits.
            self._cache = None  # freed before the new one is made
            self._cache, fresh = self._empty_cache(need), []
        elif need > self._cache.max_length:
            self._cache = _resized(self._cache, self._cache_length(need))
        if fresh:
            self._reset_rows(fresh)
        if prefix:
            if segment:
                self._reset_rows(shared, self._segment[1])
            if len(prefix) > segment:
                self._prefill_apart(prefix[segment:], shared)
            self.shared_prefix_tokens += len(prefix) * (len(shared) - 1)
            # Kept for sessions that start later on the same prefix (an evaluation's next tasks under
            # the same system prompt and skill): one row's state, copied in instead of pre-filled again.
            self._prefix = (list(prefix), _take_rows(self._cache, jnp.asarray([shared[0]], jnp.int32)), segment)
            for i in shared:
                new_tokens[i] = new_tokens[i][len(prefix):]
        if reuse:
            self._restore_prefix(reuse)
            for i in reuse:
                new_tokens[i] = new_tokens[i][len(self._prefix[0]):]
        # The turn runs on the requested rows alone where they fit a smaller row bucket: their cache
        # rows are gathered, pre-filled and decoded at that batch, and put back (idle rows would
        # otherwise cost as much as busy ones: a step's 16 episodes in a 32-row cache, the last
        # episodes of an evaluation).
        requested = sorted(self._rows[r.session].index for r in requests)
        width = self._row_bucket(len(requested))
        # A long new history (a session starting on a prompt of its own beside sessions adding one
        # observation each: the gate's and a masked step's skill texts) would set the width of every
        # row's pre-fill. Its head is pre-filled apart, at batch 1, once per distinct history (GRPO
        # siblings share theirs), where that costs less (`_heads_apart`).
        histories = {self._rows[r.session].index: self._rows[r.session].cached for r in requests}
        for rows, head in self._heads_apart(new_tokens, histories, starting, width):
            self._prefill_apart(head, rows)
            self.apart_tokens += len(head)
            for i in rows:
                new_tokens[i] = new_tokens[i][len(head):]
        if width < self.config.max_batch:
            busy = set(requested)
            rows = requested + [i for i in range(self.config.max_batch) if i not in busy][: width - len(requested)]
            cache = _take_rows(self._cache, jnp.asarray(rows, jnp.int32))
        else:
            rows, cache = list(range(self.config.max_batch)), self._cache
        at = {row: k for k, row in enumerate(rows)}  # cache row -> position in this turn's batch
        logits, cache = self._prefill_rows({at[i]: t for i, t in new_tokens.items()}, cache)
        active = np.zeros(len(rows), bool)
        active[[at[i] for i in requested]] = True
        self._key, key = jax.random.split(self._key)
        stop = jnp.asarray(list(params.stop_token_ids) or [-1], jnp.int32)
        history = length = None
        if self.config.draft_tokens:  # the rows' latest tokens (as many as the cache holds) to draft from
            history = np.zeros((len(rows), cache.max_length + steps), np.int32)
            length = np.zeros(len(rows), np.int32)
            for r in requests:
                row = self._rows[r.session]
                tail = row.cached[-cache.max_length:]
                history[at[row.index], :len(tail)] = tail
                length[at[row.index]] = len(tail)
            history, length = jnp.asarray(history), jnp.asarray(length)
        tokens, logprobs, counts, cache, kept = decode(
            self.graphdef, self.state, cache, logits, key, jnp.asarray(active), jnp.float32(params.temperature),
            jnp.float32(params.top_p), stop, jnp.int32(params.max_new_tokens), history, length, steps=steps,
            top_k=params.top_k, shared=self._shared(), halvings=self.config.decode_halvings,
            drafts=self.config.draft_tokens)
        self.drafted_tokens_kept += int(np.sum(kept))
        self._cache = cache if width == self.config.max_batch else _put_rows(self._cache, jnp.asarray(rows), cache)
        tokens, logprobs, counts = np.asarray(tokens), np.asarray(logprobs), np.asarray(counts)
        stop_set = set(params.stop_token_ids)
        out = []
        for r in requests:
            row = self._rows[r.session]
            k = at[row.index]
            ids = tokens[k, :int(counts[k])].tolist()
            row.cached = row.cached + ids[:-1]  # the last sampled token was not fed
            reason = "stop" if ids and ids[-1] in stop_set else "length"
            out.append(Completion(ids, logprobs[k, :len(ids)].tolist(), reason, self.weight_version))
        return out

    # -- internals -----------------------------------------------------------------------------

    def _shared(self) -> DecodeCache | None:
        """The shared segment the programs read (an empty one until a prefix is installed)."""
        return None if self._segment is None else self._segment[1]

    def _segment_for(self, prefix: list[int], starting: Sequence[int]) -> int:
        """How many of `prefix`'s tokens the rows starting on it attend in the shared segment: the
        segment's where they begin it, else a new segment of them where no other live row attends
        the old one, else none (the prefix is then copied into the rows)."""
        if self._segment is None:
            return 0
        held = self._segment[0]
        start = set(starting)
        live = any(row.shared for row in self._rows.values() if row.index not in start)
        fits = bool(held) and prefix[:len(held)] == held
        if fits and (live or len(held) == min(len(prefix), self.config.shared_prefix_slots)):
            return len(held)
        if live:
            return 0
        tokens = prefix[:self.config.shared_prefix_slots]
        segment = init_cache(self.model_config, 1, self.config.shared_prefix_slots)
        for ids, mask in self._chunks(tokens):
            _, segment = prefill(self.graphdef, self.state, segment, ids, mask)
        self._segment = (list(tokens), segment)
        return len(tokens)

    def _chunks(self, tokens: list[int]):
        """`tokens` as one-row pre-fill inputs: (ids, mask) [1, W], chunks of the largest bucket,
        each left-padded to its bucket."""
        big = self.config.prefill_buckets[-1]
        for start in range(0, len(tokens), big):
            piece = tokens[start:start + big]
            width = _bucket(len(piece), self.config.prefill_buckets)
            ids = np.zeros((1, width), np.int32)
            mask = np.zeros((1, width), bool)
            ids[0, width - len(piece):] = piece
            mask[0, width - len(piece):] = True
            yield jnp.asarray(ids), jnp.asarray(mask)

    def _shared_prefix(self, new_tokens: dict[int, list[int]], starting: Sequence[int]) -> tuple[list[int], list[int]]:
        """The prefix all rows starting from an empty state share, and those rows ([] when there is
        nothing worth sharing). Each row keeps at least its last token, whose logits it needs."""
        rows = sorted(i for i in set(starting) if i in new_tokens)
        if len(rows) < 2:
            return [], []
        histories = [new_tokens[i] for i in rows]
        n = min(len(os.path.commonprefix(histories)), min(len(h) for h in histories) - 1)
        if n < self.config.prefill_buckets[0]:
            return [], []
        return histories[0][:n], rows

    def _padded(self, n: int) -> int:
        """Token columns a pre-fill of `n` new tokens computes: chunks of the largest bucket, then the
        bucket of the rest."""
        big = self.config.prefill_buckets[-1]
        return (n // big) * big + (_bucket(n % big, self.config.prefill_buckets) if n % big else 0)

    def _heads_apart(self, new_tokens: dict[int, list[int]], histories: dict[int, list[int]],
                     starting: Sequence[int], width: int) -> list[tuple[list[int], list[int]]]:
        """The heads to pre-fill apart, each with the rows it goes to: (rows, head) groups.

        The turn's batched pre-fill computes `width` rows of its longest row's padded length. With
        a cap c, every row brings at most its last c tokens to it, and each longer row's head (all
        but those c) is pre-filled apart at batch 1, once for every set of rows whose whole
        histories are equal (starting siblings; a continuing row is its own set). The cap is the
        bucket (or no cap) with the fewest computed token columns, each call apart counted as
        `apart_call_cost` more.
        """
        lengths = {i: len(t) for i, t in new_tokens.items() if t}
        if not lengths:
            return []
        longest = max(lengths.values())
        start = set(starting)
        same = {i: tuple(histories[i]) if i in start else i for i in lengths}  # rows alike share a key
        best, best_cost = None, width * self._padded(longest)
        for cap in self.config.prefill_buckets:
            if cap >= longest:
                break
            heads = {}  # one head per distinct history
            for i, n in lengths.items():
                if n > cap:
                    heads.setdefault(same[i], n - cap)
            cost = width * self._padded(cap) + sum(self._padded(n) + self.config.apart_call_cost
                                                    for n in heads.values())
            if cost < best_cost:
                best, best_cost = cap, cost
        if best is None:
            return []
        groups: dict[object, list[int]] = {}
        for i, n in sorted(lengths.items()):
            if n > best:
                groups.setdefault(same[i], []).append(i)
        return [(rows, new_tokens[rows[0]][: lengths[rows[0]] - best]) for rows in groups.values()]

    def _row_bucket(self, rows: int) -> int:
        """The batch a turn of `rows` sessions runs at: max_batch, or max_batch halved while the
        rows fit, down to a quarter of it (each width compiles its own programs)."""
        width = self.config.max_batch
        while width % 2 == 0 and width // 2 >= max(rows, self.config.max_batch // 4, 1):
            width //= 2
        return width

    def _cache_length(self, need: int) -> int:
        """The cache size for `need` slots: min_cache_length grown by cache_growth as often as needed."""
        length = self.config.min_cache_length
        while length < need:
            length = -(-int(length * self.config.cache_growth) // 128) * 128
        return min(length, self.config.max_length)

    def _empty_cache(self, need: int) -> DecodeCache:
        return init_cache(self.model_config, self.config.max_batch, self._cache_length(need))

    def _reset_rows(self, rows: list[int], origin: DecodeCache | None = None) -> None:
        mask = np.zeros(self.config.max_batch, bool)
        mask[rows] = True
        self._cache = _reset_rows(self._cache, jnp.asarray(mask), origin)

    def _prefill_apart(self, tokens: list[int], rows: list[int]) -> None:
        """Pre-fills `tokens` once, at batch 1, on top of the state of `rows[0]`, and writes the result
        into every row of `rows` (all of which hold that same state)."""
        targets = self._targets(rows)
        for ids, mask in self._chunks(tokens):
            self._cache = _prefill_apart(self.graphdef, self.state, self._cache, jnp.int32(rows[0]), ids, mask,
                                         targets, self._shared())

    def _targets(self, rows: Sequence[int]) -> jax.Array:
        """`rows` as a fixed-size index vector (max_batch entries, the rest out of range: dropped)."""
        targets = np.full(self.config.max_batch, self.config.max_batch, np.int32)
        targets[: len(rows)] = rows
        return jnp.asarray(targets)

    def _restore_prefix(self, rows: list[int]) -> None:
        """Puts the kept prefix's state into the (empty) rows `rows`."""
        known, state, segment = self._prefix
        if state.max_length != self._cache.max_length:  # the cache grew or started over since
            state = _resized(state, self._cache.max_length)
            self._prefix = (known, state, segment)
        self._cache = _put_rows(self._cache, self._targets(rows), state)
        self.shared_prefix_tokens += len(known) * len(rows)

    def _prefill_rows(self, new_tokens: dict[int, list[int]], cache: DecodeCache) -> tuple[jax.Array, DecodeCache]:
        """Pre-fills each row's `new_tokens` into `cache` (its rows: this turn's batch); the last
        token's logits per row (zeros for rows without new tokens) and the cache."""
        b = cache.key_valid.shape[0]
        pending = {i: list(t) for i, t in new_tokens.items()}
        logits = jnp.zeros((b, self.model_config.vocab_size), jnp.float32)
        big = self.config.prefill_buckets[-1]
        while pending:
            width = _bucket(max(min(len(t), big) for t in pending.values()), self.config.prefill_buckets)
            ids = np.zeros((b, width), np.int32)
            mask = np.zeros((b, width), bool)
            for i, toks in pending.items():
                piece = toks[:width]
                ids[i, width - len(piece):] = piece  # left padding: the last column is the newest token
                mask[i, width - len(piece):] = True
            step_logits, cache = prefill(self.graphdef, self.state, cache, jnp.asarray(ids), jnp.asarray(mask),
                                         self._shared())
            got = np.zeros(b, bool)
            got[list(pending)] = True
            logits = jnp.where(jnp.asarray(got)[:, None], step_logits, logits)
            pending = {i: t[width:] for i, t in pending.items() if len(t) > width}
        return logits, cache


# The x86 flags under which XLA:CPU multiplies bfloat16 in hardware, where its bfloat16 products
# were measured faster than float32; without them (measured on AVX2) it converts them, slower.
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# Those under which it also runs a pre-fill's batched bfloat16 products over the cache
# (`ModelConfig.cache_product_dtype`). With AVX512-BF16 alone (an AMD EPYC Zen 4, jax 0.10.2) the
# weight products run (32 episodes of SmolLM2 with S0 1.26x as fast as in float32) but those fail:
# "Unsupported element type for DotThunk::Execute: BF16 x BF16 = F32".
BF16_CACHE_PRODUCT_CPU_FLAGS = ("amx_bf16",)


def _cpu_flags(cpuinfo: str) -> list[str]:
    """The flags `cpuinfo` lists for its first processor (none where unreadable, e.g. not Linux)."""
    try:
        with open(cpuinfo) as f:
            return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []


@functools.cache
def native_bfloat16_products(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the default backend multiplies bfloat16 in hardware: any accelerator; a CPU only
    where `cpuinfo` lists one of `NATIVE_BF16_CPU_FLAGS`."""
    if jax.default_backend() != "cpu":
        return True
    native = [flag for flag in NATIVE_BF16_CPU_FLAGS if flag in _cpu_flags(cpuinfo)]
    log.info("bfloat16 products on this CPU: %s", f"in hardware ({', '.join(native)})" if native else
             f"converted (no {' or '.join(NATIVE_BF16_CPU_FLAGS)} in {cpuinfo}): samplers set to "
             "'bfloat16_if_native' keep the policy's own weights")
    return bool(native)


@functools.cache
def bfloat16_cache_products(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the default backend runs a pre-fill's bfloat16 products over the cache: any
    accelerator; a CPU only where `cpuinfo` lists one of `BF16_CACHE_PRODUCT_CPU_FLAGS`."""
    return jax.default_backend() != "cpu" or any(f in _cpu_flags(cpuinfo) for f in BF16_CACHE_PRODUCT_CPU_FLAGS)


def for_sampling(model: nnx.Module, weight_dtype: str | None = None) -> nnx.Module:
    """The model the sampler's programs run: `model` itself, or a model of its own when the sampler
    keeps its weights in another dtype (cast once per weight version) or its config asks for
    [in, out] copies of the weights (`ModelConfig.transpose_decode_weights`); the caller's model is
    left as it is."""
    config = model.config
    cast = weight_dtype is not None and weight_dtype != config.param_dtype
    if not (cast or config.transpose_decode_weights):
        return model
    if cast:
        config = config.replace(param_dtype=weight_dtype)
        if weight_dtype == "bfloat16" and not bfloat16_cache_products():
            config = config.replace(cache_product_dtype="float32")
        sampling_model = nnx.eval_shape(lambda: type(model)(config, rngs=nnx.Rngs(0)))
        nnx.update(sampling_model, jax.tree.map(lambda x: x.astype(weight_dtype), nnx.state(model, nnx.Param)))
    else:
        sampling_model = nnx.merge(*nnx.split(model))  # new modules over the same arrays
    if config.transpose_decode_weights:
        sampling_model.transpose_for_decode()
    return sampling_model


# Module-level jitted functions with the graph definition static: samplers of the same architecture
# share compiled programs (tests, weight swaps), and the cache buffers are donated. `prefill` and
# `decode` are public so `intraskill_jax.compile_check` can compile them for TPU topologies.
@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def prefill(graphdef, state, cache: DecodeCache, ids, mask, shared: DecodeCache | None = None):
    model = nnx.merge(graphdef, state)
    hidden, cache = model.hidden_states(ids, mask, cache=cache, shared=shared)
    return model.logits(hidden[:, -1]), cache


def _map_rows(fn, cache: DecodeCache, *others: DecodeCache) -> DecodeCache:
    """Applies `fn` to every per-row array of `cache` (zipped with the same arrays of `others`)."""
    layers = tuple(jax.tree.map(fn, layer, *(o.layers[i] for o in others)) for i, layer in enumerate(cache.layers))
    return DecodeCache(layers=layers, key_valid=fn(cache.key_valid, *(o.key_valid for o in others)),
                       length=fn(cache.length, *(o.length for o in others)),
                       next_position=fn(cache.next_position, *(o.next_position for o in others)),
                       shared_length=fn(cache.shared_length, *(o.shared_length for o in others)))


@jax.jit
def _take_rows(cache: DecodeCache, rows: jax.Array) -> DecodeCache:
    """The cache of `rows` [K] alone (a K-row cache)."""
    return _map_rows(lambda x: x[rows], cache)


def _write_rows(cache: DecodeCache, rows: jax.Array, sub: DecodeCache) -> DecodeCache:
    """`cache` with row `rows[k]` replaced by row k of `sub` (by its only row, when it has one), for
    the in-range entries of `rows` [K], which come first (padding entries, out of range, after).

    One row per iteration of a loop of in-place updates: for a scatter of the rows, or a select over
    the whole cache, XLA:CPU wrote the whole cache (0.65 s at SmolLM2's 32 x 2,048 slots, for one
    row)."""
    n = jnp.sum(rows < cache.key_valid.shape[0])
    single = sub.key_valid.shape[0] == 1

    def body(k, cache):
        src = 0 if single else k
        return _map_rows(lambda x, y: jax.lax.dynamic_update_slice_in_dim(
            x, jax.lax.dynamic_slice_in_dim(y, src, 1, axis=0), rows[k], axis=0), cache, sub)

    return jax.lax.fori_loop(0, n, body, cache)


_put_rows = jax.jit(_write_rows, donate_argnums=(0,))


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def _prefill_apart(graphdef, state, cache: DecodeCache, source, ids, mask, targets,
                   shared: DecodeCache | None = None) -> DecodeCache:
    """Pre-fills ids [1, W] on row `source` alone, then writes its state into the rows `targets`."""
    model = nnx.merge(graphdef, state)
    one = _map_rows(lambda x: jax.lax.dynamic_slice_in_dim(x, source, 1, axis=0), cache)
    _, one = model.hidden_states(ids, mask, cache=one, shared=shared)
    return _write_rows(cache, targets, one)


@functools.partial(jax.jit, static_argnums=(0,), static_argnames=("steps", "top_k", "halvings", "drafts"),
                   donate_argnums=(2,))
def decode(graphdef, state, cache: DecodeCache, logits, key, active, temperature, top_p, stop_ids, max_new,
           history=None, history_length=None, *, steps: int, top_k: int, shared: DecodeCache | None = None,
           halvings: int = 0, drafts: int = 0):
    """Samples up to `steps` tokens per `active` row, each fed back while its row still generates.
    Returns (tokens [B, steps], log-probs [B, steps], counts [B], the cache, drafted tokens kept [B]).

    With `halvings`, once at most half the rows still generate, they go on alone at half the batch
    (their cache rows copied out, and back when they end), as many times: on a CPU a step's
    products and cache reads cost what its rows do, and the replies of a turn end at different
    steps (SmolLM2's first turn: 64 steps for a mean of 40 tokens), so its last steps ran for a few
    rows at the price of all.

    With `drafts` = K > 0 (attention-only models), each step feeds its sampled token and K tokens
    drafted from the row's own history (`history` [B, L], the last `history_length` [B] entries of
    it real, followed by room for the reply: `prompt_lookup`), takes every position's logits, and
    keeps the drafted tokens the model agrees with (`sampling.accept_drafts`): a reply copies much
    of what the session already holds (the tool call's frame, a product id, an option's value), so
    a step yields up to K + 1 tokens. The slots of the drafted tokens not kept are given back
    (`_rewind`): a DeltaNet's recurrent state could not be."""
    model = nnx.merge(graphdef, state)
    b = logits.shape[0]
    columns = jnp.arange(drafts + 1)

    def put(buf, at, values, mask):  # buf[r, at[r] + j] = values[r, j] where mask[r, j]
        width = buf.shape[1]
        return buf.at[jnp.arange(buf.shape[0])[:, None], jnp.where(mask, at[:, None] + columns[: mask.shape[1]],
                                                                   width)].set(values, mode="drop")

    def body(carry):
        i, cache, key, row = carry
        alive, counts = row["alive"], row["counts"]
        b = alive.shape[0]  # the rows of this loop: fewer once a call halves its batch
        if drafts:
            key, sub, check_key = jax.random.split(key, 3)
        else:
            key, sub = jax.random.split(key)
        tok, lp = sample_tokens(row["logits"], sub, temperature, top_p, top_k, row.get("exclude"))
        counts = counts + alive.astype(jnp.int32)
        go = alive & ~jnp.isin(tok, stop_ids) & (counts < max_new)
        ids, emit, lps = tok[:, None], alive[:, None], lp[:, None]
        if drafts:
            hist = put(row["history"], row["history_length"], tok[:, None], alive[:, None])
            hlen = row["history_length"] + alive.astype(jnp.int32)
            ids = jnp.concatenate([ids, prompt_lookup(hist, hlen, drafts)], axis=1)
        feed = jnp.broadcast_to(go[:, None], ids.shape)

        def check(cache):
            hidden, cache = model.hidden_states(ids, feed, cache=cache, shared=shared)
            return model.logits(hidden).astype(jnp.float32), cache

        def idle(cache):
            return jnp.broadcast_to(row["logits"][:, None], (*ids.shape, row["logits"].shape[-1])), cache

        out, cache = jax.lax.cond(jnp.any(go), check, idle, cache)
        kept = jnp.zeros((b,), jnp.int32)
        if drafts:
            guess = ids[:, 1:]
            agree, guess_lps = accept_drafts(out[:, :-1].reshape(b * drafts, -1), guess.reshape(-1), check_key,
                                             temperature, top_p, top_k)
            # A drafted token is emitted while every one before it was kept and none of them ended
            # the reply (a stop token, or max_new reached): both cut the kept run.
            stops = jnp.isin(guess, stop_ids)
            after_stop = jnp.cumsum(stops, axis=1) - stops
            emitted = (jnp.cumprod(agree.reshape(b, drafts), axis=1).astype(bool) & (after_stop == 0)
                       & (counts[:, None] + columns[1:] <= max_new) & go[:, None])
            kept = jnp.sum(emitted, axis=1, dtype=jnp.int32)
            emit = jnp.concatenate([emit, emitted], axis=1)
            lps = jnp.concatenate([lps, guess_lps.reshape(b, drafts)], axis=1)
            hist = put(hist, hlen, guess, emitted)
            last = jnp.take_along_axis(ids, kept[:, None], axis=1)[:, 0]
        else:
            last = tok
        tokens = put(row["tokens"], row["counts"], ids, emit)
        lps = put(row["lps"], row["counts"], lps, emit)
        counts = counts + kept
        going = go & ~jnp.isin(last, stop_ids) & (counts < max_new)
        # The logits after each row's last token fed: its next token's. (The rows that did not feed
        # are done.) A gather of them made libtpu's compiler fail a check (jax 0.10.2).
        logits = (jnp.sum(jnp.where(kept[:, None, None] == columns[None, :, None], out, 0.0), axis=1) if drafts
                  else out[:, 0])
        row = dict(row, alive=going, counts=counts, tokens=tokens, lps=lps, logits=logits, kept=row["kept"] + kept)
        if drafts:
            # The rows fed every drafted token; they keep the ones emitted and, going on, their last
            # emitted token too (a row that ends leaves its last token unfed, as in plain decoding).
            cache = _rewind(cache, jnp.where(go, drafts + 1 - kept - going.astype(jnp.int32), 0))
            rejected = jnp.take_along_axis(ids, jnp.minimum(kept + 1, drafts)[:, None], axis=1)[:, 0]
            row.update(history=hist, history_length=hlen + kept,
                       exclude=jnp.where(going & (kept < drafts), rejected, -1))
        return i + 1, cache, key, row

    def run(carry, halvings):
        rows = carry[3]["alive"].shape[0]
        halve = halvings > 0 and rows % 2 == 0
        floor = rows // 2 if halve else 0
        carry = jax.lax.while_loop(lambda c: (c[0] < steps) & (jnp.sum(c[3]["alive"]) > floor), body, carry)
        if not halve:
            return carry

        def on_half(carry):
            i, cache, key, row = carry
            # The rows still generating first, in order: at most `floor` of them.
            idx = jnp.argsort(~row["alive"], stable=True)[:floor]
            i, part_cache, key, part = run((i, _map_rows(lambda x: x[idx], cache), key,
                                            jax.tree.map(lambda x: x[idx], row)), halvings - 1)
            return (i, _write_rows(cache, idx, part_cache), key,
                    jax.tree.map(lambda x, y: x.at[idx].set(y), row, part))

        return jax.lax.cond((carry[0] < steps) & jnp.any(carry[3]["alive"]), on_half, lambda c: c, carry)

    row = dict(logits=logits.astype(jnp.float32), alive=active, tokens=jnp.zeros((b, steps), jnp.int32),
               lps=jnp.zeros((b, steps), jnp.float32), counts=jnp.zeros((b,), jnp.int32),
               kept=jnp.zeros((b,), jnp.int32))
    if drafts:
        row.update(history=history, history_length=history_length, exclude=jnp.full((b,), -1, jnp.int32))
    _, cache, _, row = run((jnp.int32(0), cache, key, row), halvings)
    return row["tokens"], row["lps"], row["counts"], cache, row["kept"]


def prompt_lookup(history: jax.Array, length: jax.Array, k: int, match: int = 3) -> jax.Array:
    """K tokens drafted per row from its own history [B, L] (its first `length` [B] entries real):
    the tokens that followed the latest earlier occurrence of its last `match` tokens (or of fewer,
    down to one, where those never occurred before), repeated with their period where the
    occurrence runs into the end; without any occurrence, its last token. Any draft is correct
    (`sampling.accept_drafts` keeps only what the model agrees with); a good one saves steps."""
    positions = jnp.arange(history.shape[1])
    last = length[:, None] - 1
    found = jnp.full(length.shape, -1)
    matched = positions[None] < last  # an occurrence ends at p, with p + 1 still in the history
    for n in range(match):
        earlier = jnp.pad(history, ((0, 0), (n, 0)))[:, : history.shape[1]]  # earlier[:, p] = history[:, p - n]
        own = jnp.take_along_axis(history, jnp.maximum(last - n, 0), axis=1)
        matched = matched & (earlier == own) & (positions[None] >= n) & (last - n >= 0)
        # The longest match that occurred wins; shorter ones fill in where it did not.
        found = jnp.where(jnp.any(matched, axis=1), jnp.max(jnp.where(matched, positions[None], -1), axis=1), found)
    period = jnp.where(found >= 0, last[:, 0] - found, 1)
    start = jnp.where(found >= 0, found + 1, last[:, 0])
    at = start[:, None] + jnp.arange(k)[None] % period[:, None]
    return jnp.take_along_axis(history, jnp.clip(at, 0, history.shape[1] - 1), axis=1)


@jax.jit
def _rewind(cache: DecodeCache, n: jax.Array) -> DecodeCache:
    """`cache` without the last `n` [B] tokens each row wrote: their slots invalid again and free for
    the row's next tokens (attention layers; a DeltaNet's recurrent state cannot be rewound)."""
    length = cache.length - n
    slots = jnp.arange(cache.max_length)[None]
    given_back = (slots >= length[:, None]) & (slots < cache.length[:, None])
    return cache.replace(key_valid=cache.key_valid & ~given_back, length=length, next_position=cache.next_position - n)


def _resized(cache: DecodeCache, length: int) -> DecodeCache:
    """`cache` with `length` slots: new slots are empty (invalid keys, zero K/V); fewer slots cut the
    last ones (the caller knows no row holds a token there). `cache` is consumed: each of its arrays
    is freed once its copy is made, so the two are never held whole at once (SmolLM2's evaluation:
    3.0 GB old and 5.3 GB new)."""
    extra = length - cache.max_length

    def pad(x: jax.Array, axis: int) -> jax.Array:
        if extra < 0:
            out = jax.lax.slice_in_dim(x, 0, length, axis=axis)
        else:
            out = jnp.pad(x, [(0, extra) if i == axis else (0, 0) for i in range(x.ndim)])
        x.delete()  # its buffer is released once the copy reading it is done
        return out

    layers = tuple(AttentionCache(key=pad(layer.key, 2), value=pad(layer.value, 2))
                   if isinstance(layer, AttentionCache) else layer for layer in cache.layers)
    return DecodeCache(layers=layers, key_valid=pad(cache.key_valid, 1), length=cache.length,
                       next_position=cache.next_position, shared_length=cache.shared_length)


@functools.partial(jax.jit, donate_argnums=(0,))
def _reset_rows(cache: DecodeCache, rows: jax.Array, origin: DecodeCache | None = None) -> DecodeCache:
    """Empties `rows` [B] (a mask): their KV slots invalidated, their recurrent and conv state zeroed,
    or, with `origin` (the shared segment: a one-row cache), set to its state after its tokens,
    which they then attend as a shared prefix."""
    layers = []
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, DeltaNetCache):
            start = origin.layers[i] if origin is not None else DeltaNetCache(conv_state=0, recurrent_state=0)
            layer = DeltaNetCache(
                conv_state=jnp.where(rows[:, None, None], start.conv_state, layer.conv_state),
                recurrent_state=jnp.where(rows[:, None, None, None], start.recurrent_state, layer.recurrent_state))
        layers.append(layer)
    shared = 0 if origin is None else origin.length[0]
    return DecodeCache(layers=tuple(layers), key_valid=cache.key_valid & ~rows[:, None],
                       length=jnp.where(rows, 0, cache.length), next_position=jnp.where(rows, shared, cache.next_position),
                       shared_length=jnp.where(rows, shared, cache.shared_length))
