"""Smoke test of the benchmark's functions on a small catalog: keys and sane values, no timing."""

from __future__ import annotations

import json
import math

from sim import bench


def test_bench_smoke(capsys):
    out = bench.run(num_products=1200, queries=40, rank_bm25_queries=8, env_steps=300, large=1200,
                    large_queries=10, isolate_large=False)
    for key in ("env_steps_per_s", "search_p50_ms_20k", "search_p99_ms_20k", "search_p50_ms_1m",
                "index_build_s_1m", "rss_mb_1m", "speedup_vs_sqlite_fts5", "speedup_vs_rank_bm25"):
        assert isinstance(out[key], float) and math.isfinite(out[key]) and out[key] > 0, (key, out[key])
    assert out["search_p50_ms_20k"] <= out["search_p99_ms_20k"]
    for key in ("recall_at_20", "recall_at_20_simple"):
        assert {"ours", "sqlite_fts5", "rank_bm25"} <= set(out[key])
        assert all(0.0 <= v <= 1.0 for v in out[key].values())
    # Oracle queries on a small catalog: every engine finds nearly every target.
    assert min(out["recall_at_20"].values()) >= 0.8
    assert out["details"]["env"]["env_steps"] >= 300
    assert out["details"]["env"]["env_action_mix"]["buy"] > 0
    assert out["config"]["num_products"] == 1200
    json.dumps(out)  # serialisable as the one JSON object `--json` prints


def test_engines_agree_on_weights_and_tokens():
    """FTS5 gets the same field weights (UNINDEXED placeholder first) and tokens; top hits agree."""
    from sim.catalog import SyntheticCatalog
    from sim.config import CatalogConfig, SearchConfig
    from sim.search import SearchIndex

    cat = SyntheticCatalog(CatalogConfig(num_products=240, lang="zh"))
    products = [cat[i] for i in range(len(cat))]
    fts = bench.Fts5Engine(products, SearchConfig())
    rank = fts.db.execute("SELECT v FROM docs_config WHERE k = 'rank'").fetchone()[0]
    assert rank == "bm25(0.0, 3.0, 2.0, 2.0, 1.5, 1.2)"
    ours = SearchIndex.build(products, SearchConfig())
    rb = bench.RankBm25Engine(products, SearchConfig())
    hits = 0
    for i in range(0, 240, 12):
        q = cat.tasks[i].instruction
        top = {tuple(e(q, 20)[:1]) for e in (ours.search, fts.search, rb.search)}
        hits += cat.index_of(cat.tasks[i].asin) in fts.search(q, 20)
        assert all(len(t) == 1 for t in top)
    assert hits >= 18
