import math
from collections import Counter

import numpy as np
import pytest

from sim.catalog import SyntheticCatalog
from sim.config import CatalogConfig, SearchConfig
from sim.search import SearchIndex, product_fields
from sim.text import tokenize


def reference_bm25f(products, config: SearchConfig, query: str) -> np.ndarray:
    """Textbook BM25F, written independently: dense loops over documents and query terms."""
    weights = config.field_weights
    docs = []
    for p in products:
        tf = Counter()
        for field, text in product_fields(p).items():
            for tok in tokenize(text):
                tf[tok] += weights[field]
        docs.append(tf)
    n = len(docs)
    lengths = [sum(d.values()) for d in docs]
    avg = sum(lengths) / n
    terms = list(dict.fromkeys(tokenize(query)))
    scores = np.zeros(n)
    for term in terms:
        df = sum(1 for d in docs if term in d)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, d in enumerate(docs):
            tf = d.get(term, 0.0)
            if tf:
                scores[i] += idf * tf / (tf + config.k1 * (1 - config.b + config.b * lengths[i] / avg))
    return scores


def test_tokenize_cjk_bigrams_latin_words_nfkc_casefold():
    assert tokenize("乳胶枕") == ["乳胶", "胶枕"]
    assert tokenize("枕") == ["枕"]
    assert tokenize("ＬＡＴＥＸ Pillow 2.5kg") == ["latex", "pillow", "2.5kg"]
    assert tokenize("I want a pillow for the kids") == ["pillow", "kids"]
    assert tokenize("泰国latex枕头") == ["泰国", "latex", "枕头"]


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("weights", [{}, {"title_weight": 1.0, "option_weight": 0.0, "k1": 0.9, "b": 0.4}])
def test_scores_match_reference_bm25f(lang, weights):
    products = list(SyntheticCatalog(CatalogConfig(num_products=600, lang=lang)))
    config = SearchConfig(**weights)
    index = SearchIndex.build(products, config)
    cat = SyntheticCatalog(CatalogConfig(num_products=600, lang=lang))
    for q in [cat.tasks[i].instruction for i in (3, 150, 480)] + [products[7].title, "nothing-matches-zzz"]:
        np.testing.assert_allclose(index.scores(q), reference_bm25f(products, config, q), rtol=1e-5, atol=1e-6)


def test_search_orders_by_score_then_index_and_drops_non_matches():
    products = list(SyntheticCatalog(CatalogConfig(num_products=600)))
    index = SearchIndex.build(products, SearchConfig())
    q = products[0].title
    ref = reference_bm25f(products, SearchConfig(), q)
    got = index.search(q, 150)
    expected = sorted(np.flatnonzero(ref > 0), key=lambda i: (-np.float32(ref[i]), i))[:150]
    assert got[:20] == expected[:20]
    assert len(got) == min(150, int((ref > 0).sum()))
    assert got[0] == 0
    assert index.search("zzzz qqqq", 10) == []
    assert index.search("", 10) == []


def test_full_instruction_finds_its_target():
    cat = SyntheticCatalog(CatalogConfig(num_products=2400))
    index = SearchIndex.build(cat, SearchConfig())
    hits = [i in index.search(cat.tasks[i].instruction, 150) for i in range(0, 2400, 60)]
    assert np.mean(hits) >= 0.9


def test_empty_catalog_is_an_error():
    with pytest.raises(ValueError, match="empty catalog"):
        SearchIndex.build([], SearchConfig())
