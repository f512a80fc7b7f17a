"""Simulator benchmark: `python -m sim.bench --json` prints one JSON object.

Measured in one run, on one corpus and one query set, so the ratios survive noisy machines:

* env_steps_per_s: single process, scripted episodes with a realistic action mix (searches with
  vague and full requests, paging, product visits, options, detail pages, back, invalid actions,
  buy); time spent inside `reset`/`step` only.
* search latency (p50/p99) of `SearchIndex.search(query, results_top_n)` at the default catalog
  size and at 1M products; the 1M catalog is generated and indexed streamed, in a fresh child
  process so its resident memory is the index's and not this run's.
* side by side on the default catalog: SQLite FTS5 (what ShopSimulator forks moved to) with
  multi-column bm25() under the same field weights and the same tokens, and rank_bm25's BM25Okapi
  (WebShop's dependency) over the concatenated tokens. Throughput ratios, and recall@20 of the
  target product for oracle queries (the full instruction) and for vague ones (instruction_simple).
"""

from __future__ import annotations

import dataclasses
import gc
import json
import multiprocessing
import platform
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from absl import flags

from sim import flagparse
from sim.catalog import SyntheticCatalog
from sim.config import CatalogConfig, EnvConfig, SearchConfig, SimConfig, SplitConfig
from sim.env import ShopEnv
from sim.records import Catalog, Task
from sim.search import SearchIndex, product_fields
from sim.text import tokenize
from sim.world import World, build_world

FIELDS = ("title", "brand", "category", "attributes", "options")
RECALL_K = 20


# -- environment ---------------------------------------------------------------------------------


def env_steps_per_s(world: World, *, min_steps: int = 6000, repeats: int = 3, seed: int = 0) -> dict[str, Any]:
    """Steps per second of scripted episodes; only time inside `reset`/`step` counts.

    The catalog is touched once first (a long run serves it from cache) and a short untimed pass
    warms the rest. The episodes are split into `repeats` blocks; the fastest block is reported, as
    timeit does: on a shared machine other load only ever adds time. Every block is in `blocks`.
    """
    env = ShopEnv(world)
    catalog = world.catalog
    for i in range(len(catalog)):
        catalog[i]
    task_ids = world.splits.train
    kinds: dict[str, int] = {}
    counters = {"steps": 0, "elapsed": 0.0}

    def act(action: str, kind: str) -> Any:
        t = time.perf_counter()
        r = env.step(action)
        counters["elapsed"] += time.perf_counter() - t
        counters["steps"] += 1
        kinds[kind] = kinds.get(kind, 0) + 1
        return r

    def block(steps: int, rng: np.random.Generator) -> tuple[int, float, int]:
        counters.update(steps=0, elapsed=0.0)
        episodes = 0
        while counters["steps"] < steps:
            task = catalog.tasks[int(task_ids[rng.integers(len(task_ids))])]
            t = time.perf_counter()
            env.reset(task.task_id)
            counters["elapsed"] += time.perf_counter() - t
            episodes += 1
            _scripted_episode(env, task, catalog, rng, act)
        return counters["steps"], counters["elapsed"], episodes

    block(max(200, min_steps // 10), np.random.default_rng([seed, 99]))
    kinds.clear()
    blocks = [block(max(1, min_steps // repeats), np.random.default_rng([seed, r])) for r in range(repeats)]
    rates = [steps / elapsed for steps, elapsed, _ in blocks]
    steps = sum(b[0] for b in blocks)
    return {"env_steps_per_s": max(rates), "env_steps": steps, "env_episodes": sum(b[2] for b in blocks),
            "blocks_steps_per_s": [round(r, 1) for r in rates],
            "overall_steps_per_s": round(steps / sum(b[1] for b in blocks), 1),
            "env_action_mix": dict(sorted(kinds.items()))}


def _scripted_episode(env: ShopEnv, task: Task, catalog: Catalog, rng: np.random.Generator,
                      act: Callable[[str, str], Any]) -> None:
    """A browsing episode: vague search, paging, a wrong product's pages, then the right one, buy."""

    def clickables() -> list[str]:
        return env.available_actions()["clickables"]

    def products_on_page() -> list[str]:
        return [c for c in clickables() if catalog.index_of(c) is not None]

    act(f"search[{task.instruction_simple if rng.random() < 0.5 else task.instruction}]", "search")
    if "next >" in clickables():
        act("click[next >]", "page")
        act("click[< prev]", "page")
    shown = products_on_page()
    if shown:
        act(f"click[{shown[int(rng.integers(len(shown)))]}]", "product")
        for detail in ("description", "features"):
            act(f"click[{detail}]", "detail")
            act("click[< prev]", "back")
        act("click[< prev]", "back")
    if rng.random() < 0.2:
        act("click[something that is not on the page]", "invalid")
    act("click[back to search]", "back")
    act(f"search[{task.instruction}]", "search")
    shown = products_on_page()
    if not shown:
        act("click[back to search]", "back")
        act(f"search[{task.instruction_simple}]", "search")
        shown = products_on_page()
        if not shown:
            return
    target = task.asin.lower() if task.asin.lower() in shown else shown[0]
    act(f"click[{target}]", "product")
    product = catalog[catalog.index_of(target)]
    for axis, values in product.options.items():
        act(f"click[{task.options.get(axis, values[0].value)}]", "option")
    if env.done:
        return
    act("click[buy now]", "buy")


# -- engines -------------------------------------------------------------------------------------


class Fts5Engine:
    """SQLite FTS5 over our tokens: multi-column bm25() with the same field weights.

    Documents are fed pre-tokenised (space-joined) to the unicode61 tokenizer, so both engines see
    the same terms; '.' inside a token ("1.5") is a separator to unicode61, hence the escape.
    The asin column is UNINDEXED, but bm25() still takes a weight for it: the leading 0.0 is that
    placeholder (without it every weight lands one column off).
    """

    def __init__(self, products: Sequence[Any], config: SearchConfig):
        weights = config.field_weights
        self.db = sqlite3.connect(":memory:")
        cols = ", ".join(FIELDS)
        self.db.execute(f"CREATE VIRTUAL TABLE docs USING fts5(asin UNINDEXED, {cols}, tokenize='unicode61')")
        rows = (
            (i + 1, p.asin, *(_fts_text(tokenize(product_fields(p)[f])) for f in FIELDS))
            for i, p in enumerate(products)
        )
        self.db.executemany(f"INSERT INTO docs(rowid, asin, {cols}) VALUES (?, ?, {', '.join('?' * len(FIELDS))})",
                            rows)
        self.db.execute("INSERT INTO docs(docs) VALUES ('optimize')")
        rank = "bm25(" + ", ".join(["0.0", *(repr(float(weights[f])) for f in FIELDS)]) + ")"
        self.db.execute("INSERT INTO docs(docs, rank) VALUES ('rank', ?)", (rank,))
        self.db.commit()

    def search(self, query: str, k: int) -> list[int]:
        terms = dict.fromkeys(_fts_token(t) for t in tokenize(query))
        if not terms:
            return []
        match = " OR ".join(f'"{t}"' for t in terms)
        rows = self.db.execute("SELECT rowid FROM docs WHERE docs MATCH ? ORDER BY rank LIMIT ?", (match, k))
        return [r[0] - 1 for r in rows]


def _fts_token(tok: str) -> str:
    return tok.replace(".", "p")


def _fts_text(tokens: list[str]) -> str:
    return " ".join(_fts_token(t) for t in tokens)


class RankBm25Engine:
    """rank_bm25's BM25Okapi over each product's fields concatenated (WebShop's dependency)."""

    def __init__(self, products: Sequence[Any], config: SearchConfig):
        from rank_bm25 import BM25Okapi

        corpus = [[t for f in FIELDS for t in tokenize(product_fields(p)[f])] for p in products]
        self.bm25 = BM25Okapi(corpus, k1=config.k1, b=config.b)

    def search(self, query: str, k: int) -> list[int]:
        toks = tokenize(query)
        if not toks:
            return []
        scores = self.bm25.get_scores(toks)
        top = np.argpartition(-scores, min(k, len(scores) - 1))[:k]
        top = top[np.lexsort((top, -scores[top]))]
        return [int(i) for i in top if scores[i] > 0]


def run_queries(search: Callable[[str, int], list[int]], queries: Sequence[str], k: int) -> tuple[np.ndarray, list[list[int]]]:
    """Per-query latency (seconds) and results, one query at a time as an environment issues them."""
    times = np.empty(len(queries))
    results = []
    for i, q in enumerate(queries):
        t = time.perf_counter()
        results.append(search(q, k))
        times[i] = time.perf_counter() - t
    return times, results


def recall_at(results: Sequence[Sequence[int]], targets: Sequence[int], k: int = RECALL_K) -> float:
    return float(np.mean([t in r[:k] for r, t in zip(results, targets)])) if targets else float("nan")


def _ms(x: float) -> float:
    return round(x * 1e3, 4)


def compare_engines(world: World, *, num_queries: int, rank_bm25_queries: int, seed: int = 0) -> dict[str, Any]:
    """Latency, throughput ratios and recall@20 of ours vs SQLite FTS5 vs rank_bm25, same corpus."""
    catalog, config = world.catalog, world.config
    k = config.env.results_top_n
    rng = np.random.default_rng([seed, 7])
    ids = rng.choice(len(catalog.tasks), size=min(num_queries, len(catalog.tasks)), replace=False)
    tasks = [catalog.tasks[int(i)] for i in ids]
    full = [t.instruction for t in tasks]
    vague = [t.instruction_simple for t in tasks]
    targets = [catalog.index_of(t.asin) for t in tasks]
    products = [catalog[i] for i in range(len(catalog))]

    # Warm caches and the numba kernel before timing anything.
    for q in full[:20]:
        world.index.search(q, k)
    t_ours, r_ours = run_queries(world.index.search, full, k)
    _, r_ours_vague = run_queries(world.index.search, vague, k)

    t = time.perf_counter()
    fts = Fts5Engine(products, config.search)
    fts_build = time.perf_counter() - t
    for q in full[:20]:
        fts.search(q, k)
    t_fts, r_fts = run_queries(fts.search, full, k)
    _, r_fts_vague = run_queries(fts.search, vague, k)
    del fts
    gc.collect()

    m = min(rank_bm25_queries, len(full))
    t = time.perf_counter()
    rb = RankBm25Engine(products, config.search)
    rb_build = time.perf_counter() - t
    t_rb, r_rb = run_queries(rb.search, full[:m], k)
    _, r_rb_vague = run_queries(rb.search, vague[:m], k)
    del rb
    gc.collect()

    ours_qps = len(full) / t_ours.sum()
    return {
        "search_p50_ms_20k": _ms(float(np.percentile(t_ours, 50))),
        "search_p99_ms_20k": _ms(float(np.percentile(t_ours, 99))),
        "speedup_vs_sqlite_fts5": round(t_fts.sum() / t_ours.sum(), 3),
        # Same queries on both sides: rank_bm25 answers only the first m.
        "speedup_vs_rank_bm25": round(t_rb.sum() / t_ours[:m].sum(), 3),
        "recall_at_20": {
            "ours": recall_at(r_ours, targets),
            "sqlite_fts5": recall_at(r_fts, targets),
            "rank_bm25": recall_at(r_rb, targets[:m]),
            "ours_on_rank_bm25_queries": recall_at(r_ours[:m], targets[:m]),
        },
        "recall_at_20_simple": {
            "ours": recall_at(r_ours_vague, targets),
            "sqlite_fts5": recall_at(r_fts_vague, targets),
            "rank_bm25": recall_at(r_rb_vague, targets[:m]),
        },
        "qps": {"ours": round(ours_qps, 1), "sqlite_fts5": round(len(full) / t_fts.sum(), 1),
                "rank_bm25": round(m / t_rb.sum(), 2)},
        "p50_ms": {"ours": _ms(float(np.percentile(t_ours, 50))), "sqlite_fts5": _ms(float(np.percentile(t_fts, 50))),
                   "rank_bm25": _ms(float(np.percentile(t_rb, 50)))},
        "build_s": {"sqlite_fts5": round(fts_build, 2), "rank_bm25": round(rb_build, 2)},
        "queries": {"ours": len(full), "sqlite_fts5": len(full), "rank_bm25": m, "k": k},
    }


# -- 1M ------------------------------------------------------------------------------------------


def bench_large(num_products: int, *, num_queries: int, seed: int = 0, k: int = 150) -> dict[str, Any]:
    """Generates and indexes a large catalog streamed; build time, resident memory, latency."""
    import psutil

    gc.collect()
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    t = time.perf_counter()
    catalog = SyntheticCatalog(CatalogConfig(seed=seed, num_products=num_products))
    index = SearchIndex.build(iter(catalog), SearchConfig(), num_docs=len(catalog))
    build_s = time.perf_counter() - t
    gc.collect()
    rss = proc.memory_info().rss
    rng = np.random.default_rng([seed, 11])
    ids = rng.choice(num_products, size=min(num_queries, num_products), replace=False)
    queries = [catalog.make_task(int(i)).instruction for i in ids]
    for q in queries[:20]:
        index.search(q, k)
    times, results = run_queries(index.search, queries, k)
    return {
        "num_products": num_products,
        "index_build_s": round(build_s, 2),
        "rss_mb": round(rss / 2**20, 1),
        "rss_mb_before": round(rss0 / 2**20, 1),
        "index_mb": round(index.nbytes / 2**20, 1),
        "num_terms": index.num_terms,
        "search_p50_ms": _ms(float(np.percentile(times, 50))),
        "search_p99_ms": _ms(float(np.percentile(times, 99))),
        "recall_at_20": recall_at(results, [int(i) for i in ids]),
        "queries": len(queries),
    }


def _bench_large_child(conn, num_products: int, num_queries: int, seed: int) -> None:
    try:
        conn.send(bench_large(num_products, num_queries=num_queries, seed=seed))
    except BaseException as e:  # report, do not hang the parent
        conn.send({"error": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()


def bench_large_isolated(num_products: int, *, num_queries: int, seed: int = 0) -> dict[str, Any]:
    """`bench_large` in a fresh process, so the memory figure is the big index's alone."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_bench_large_child, args=(child, num_products, num_queries, seed))
    p.start()
    child.close()
    out = parent.recv()
    p.join()
    if "error" in out:
        raise RuntimeError(f"1M benchmark failed in the child process: {out['error']}")
    return out


# -- entry point ---------------------------------------------------------------------------------


def run(*, num_products: int = CatalogConfig().num_products, queries: int = 500, rank_bm25_queries: int = 100,
        env_steps: int = 6000, large: int | None = 1_000_000, large_queries: int = 300, seed: int = 0,
        isolate_large: bool = True) -> dict[str, Any]:
    config = SimConfig(catalog=CatalogConfig(seed=seed, num_products=num_products),
                       splits=SplitConfig(num_test=min(400, num_products // 4), num_validation=min(200, num_products // 8)))
    load_at_start = _load()
    t = time.perf_counter()
    world = build_world(config)
    build_s = time.perf_counter() - t
    out: dict[str, Any] = {}
    env = env_steps_per_s(world, min_steps=env_steps, seed=seed)
    out["env_steps_per_s"] = round(env.pop("env_steps_per_s"), 1)
    engines = compare_engines(world, num_queries=queries, rank_bm25_queries=rank_bm25_queries, seed=seed)
    out.update({k: engines.pop(k) for k in ("search_p50_ms_20k", "search_p99_ms_20k")})
    del world
    gc.collect()
    if large:
        big = bench_large_isolated(large, num_queries=large_queries, seed=seed) if isolate_large else \
            bench_large(large, num_queries=large_queries, seed=seed)
        out.update(search_p50_ms_1m=big["search_p50_ms"], index_build_s_1m=big["index_build_s"],
                   rss_mb_1m=big["rss_mb"])
    else:
        big = None
        out.update(search_p50_ms_1m=None, index_build_s_1m=None, rss_mb_1m=None)
    out.update({k: engines.pop(k) for k in ("speedup_vs_sqlite_fts5", "speedup_vs_rank_bm25", "recall_at_20",
                                            "recall_at_20_simple")})
    out["details"] = {"engines": engines, "env": env, "large": big, "world_build_s_20k": round(build_s, 2)}
    out["config"] = {
        "num_products": num_products, "seed": seed, "queries": queries, "rank_bm25_queries": rank_bm25_queries,
        "recall_k": RECALL_K, "env_steps": env_steps, "large_products": large, "large_queries": large_queries,
        "search": dataclasses.asdict(config.search), "env": dataclasses.asdict(EnvConfig()),
        "lang": config.catalog.lang, "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
        "notes": (f"rank_bm25 answers the first {min(rank_bm25_queries, queries)} of the {queries} queries "
                  "(BM25Okapi.get_scores scans the corpus in Python per query term, ~0.1-0.3 s a query at 20K); "
                  "speedup_vs_rank_bm25 compares ours on those same queries. env_steps_per_s is the fastest of "
                  "the blocks in details.env (other load on a shared machine only adds time)."),
        "cpus": _cpus(), "load_avg_at_start": load_at_start, "load_avg_at_end": _load(),
    }
    return out


def _load() -> list[float] | None:
    import os

    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _define_flags(values: flags.FlagValues) -> None:
    flags.DEFINE_bool("json", False, "print one JSON object (the tracked figures)", flag_values=values)
    flags.DEFINE_bool("skip-1m", False, "skip the 1M-product catalog (quick runs)", flag_values=values)
    flags.DEFINE_integer("queries", 500, "oracle queries for ours and SQLite FTS5", flag_values=values)
    flags.DEFINE_integer("rank-bm25-queries", 100,
                         "queries for rank_bm25 (a full-corpus Python scan per query term, so fewer)", flag_values=values)
    flags.DEFINE_integer("env-steps", 6000, "minimum env steps to time", flag_values=values)
    flags.DEFINE_integer("products", CatalogConfig().num_products, "default catalog size", flag_values=values)
    flags.DEFINE_integer("large", 1_000_000, "size of the large catalog", flag_values=values)
    flags.DEFINE_integer("seed", 0, "seed of the catalogs and queries", flag_values=values)


def main(argv: Sequence[str] | None = None) -> int:
    args = flagparse.parse("python -m sim.bench", __doc__, _define_flags, argv)
    out = run(num_products=args.products, queries=args.queries, rank_bm25_queries=args.rank_bm25_queries,
              env_steps=args.env_steps, large=None if args.skip_1m else args.large, seed=args.seed)
    if args.json:
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(json.dumps(out, ensure_ascii=False, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
