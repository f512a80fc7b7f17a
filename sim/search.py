"""Field-weighted BM25 product search on bm25s.

Scoring is BM25F (Robertson, Zaragoza & Taylor 2004): per-field term frequencies are weighted and
summed *before* saturation, with one length normalisation over the weighted document length.
That beats summing per-field BM25 scores, which lets a term matched in several fields saturate
several times. bm25s has no multi-field model, so the weighted postings are built here, streamed
in chunks (a 1M-product catalog never exists as Python objects at once), and handed to a
`bm25s.BM25` retriever, whose sparse scorer (numba-compiled when numba is installed) does the
query-time work. The index is immutable after `build` and shared read-only by every environment.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Sequence

import numpy as np
import scipy.sparse as sp
from tqdm.auto import tqdm

from sim.config import SearchConfig
from sim.records import Product
from sim.text import tokenize

log = logging.getLogger(__name__)


def _import_bm25s():
    """Imports bm25s with JAX hidden from it.

    When JAX is importable, bm25s runs a JAX computation at import time (a top-k probe), which
    initialises XLA's backends: that costs seconds, makes the simulator depend on JAX, and in the
    trainer would happen before `jax.distributed.initialize()`, which must come first. Our top-k
    is NumPy, so bm25s never needs JAX.
    """
    if "bm25s" in sys.modules:
        return sys.modules["bm25s"]
    saved = {name: sys.modules.get(name) for name in ("jax", "jax.lax")}
    try:
        for name in saved:
            sys.modules[name] = None  # type: ignore[assignment]  # makes `import jax` raise ImportError
        import bm25s
    finally:
        for name, module in saved.items():
            if module is None:
                del sys.modules[name]
            else:
                sys.modules[name] = module
    return bm25s


bm25s = _import_bm25s()


def product_fields(p: Product) -> dict[str, str]:
    """The searchable text of a product, by field."""
    options = " ".join(f"{axis} " + " ".join(v.value for v in values) for axis, values in p.options.items())
    return {
        "title": p.title,
        "brand": f"{p.brand} {p.shop}",
        "category": " ".join(p.category),
        "attributes": " ".join(p.attributes),
        "options": options,
    }


class SearchIndex:
    """Immutable BM25F index over a catalog; `search` returns product indices, best first.

    Ties are broken by product index ascending, so results are deterministic.
    """

    def __init__(self, retriever: bm25s.BM25, vocab: dict[str, int], num_docs: int):
        self._retriever = retriever
        self._vocab = vocab
        self.num_docs = num_docs

    @classmethod
    def build(
        cls,
        products: Iterable[Product],
        config: SearchConfig,
        *,
        num_docs: int | None = None,
        chunk_size: int = 8192,
        progress: bool = False,
    ) -> SearchIndex:
        weights = config.field_weights
        vocab: dict[str, int] = {}
        docs, toks, tfs, lengths = [], [], [], []
        buf_d: list[int] = []
        buf_t: list[int] = []
        buf_f: list[float] = []
        n = 0
        # Category, shop and option texts repeat across a sub-category: tokenise each distinct
        # text once. Ids are still assigned in first-seen order, so the index is unchanged.
        token_ids: dict[str, list[int]] = {}
        for p in tqdm(products, total=num_docs, desc="indexing products", unit="doc", disable=not progress):
            tf: dict[int, float] = {}
            for field, text in product_fields(p).items():
                w = weights[field]
                if w == 0:
                    continue
                ids = token_ids.get(text)
                if ids is None:
                    ids = [vocab.setdefault(tok, len(vocab)) for tok in tokenize(text)]
                    if len(token_ids) >= 1 << 18:
                        token_ids.clear()
                    token_ids[text] = ids
                for i in ids:
                    tf[i] = tf.get(i, 0) + w
            buf_d.extend([n] * len(tf))
            buf_t.extend(tf.keys())
            buf_f.extend(tf.values())
            lengths.append(sum(tf.values()))
            n += 1
            if len(buf_d) >= chunk_size * 32:
                docs.append(np.asarray(buf_d, np.int32))
                toks.append(np.asarray(buf_t, np.int32))
                tfs.append(np.asarray(buf_f, np.float32))
                buf_d, buf_t, buf_f = [], [], []
        docs.append(np.asarray(buf_d, np.int32))
        toks.append(np.asarray(buf_t, np.int32))
        tfs.append(np.asarray(buf_f, np.float32))
        if n == 0:
            raise ValueError("cannot build a search index over an empty catalog")
        doc = np.concatenate(docs)
        tok = np.concatenate(toks)
        tf = np.concatenate(tfs)
        del docs, toks, tfs
        doc_len = np.asarray(lengths, np.float32)
        avg_len = float(doc_len.mean())
        df = np.bincount(tok, minlength=len(vocab)).astype(np.float64)
        # Lucene's BM25 (bm25s method="lucene"): non-negative idf; tf saturation without (k1+1).
        idf = np.log1p((n - df + 0.5) / (df + 0.5)).astype(np.float32)
        norm = config.k1 * (1.0 - config.b + config.b * doc_len[doc] / avg_len)
        score = idf[tok] * tf / (tf + norm)
        csc = sp.csc_matrix((score.astype(np.float32), (doc, tok)), shape=(n, len(vocab)))
        csc.sort_indices()
        retriever = bm25s.BM25(
            k1=config.k1, b=config.b, method="lucene", backend="numba" if _has_numba() else "numpy"
        )
        retriever.scores = {
            "data": csc.data,
            "indices": csc.indices.astype(np.int32),
            "indptr": csc.indptr.astype(np.int64),
            "num_docs": n,
        }
        retriever.vocab_dict = vocab
        retriever.nonoccurrence_array = None
        if retriever.backend == "numba":
            # bm25s 0.3's auto_compile test is inverted (it compiles only when NUMBA_DISABLE_JIT is
            # set), so the numpy scorer (np.add.at) ran: 3x slower, same sums in the same order.
            # Compiling here also keeps the JIT pause out of the first episode's search.
            retriever.activate_numba_scorer()
            retriever.get_scores_from_ids([0])
        if _top_k_jit is not None:
            _top_k_jit(np.ones(2, np.float32), 1)
        log.info("built BM25F index: %d docs, %d terms, %d postings", n, len(vocab), csc.nnz)
        return cls(retriever, vocab, n)

    def query_ids(self, query: str) -> list[int]:
        seen: dict[int, None] = {}
        for tok in tokenize(query):
            i = self._vocab.get(tok)
            if i is not None:
                seen[i] = None
        return list(seen)

    def scores(self, query: str) -> np.ndarray:
        """BM25F score of every document for `query` (float32, length num_docs)."""
        ids = self.query_ids(query)
        if not ids:
            return np.zeros(self.num_docs, np.float32)
        return self._retriever.get_scores_from_ids(ids)

    def search(self, query: str, k: int) -> list[int]:
        """Indices of the top-k matching documents (score > 0), best first, ties by index."""
        scores = self.scores(query)
        if _top_k_jit is not None and k >= 1:
            return _top_k_jit(scores, k).tolist()
        hits = np.flatnonzero(scores)
        if hits.size > k:
            top = np.argpartition(-scores[hits], k - 1)[:k]
            # Keep every document tied with the k-th score, so the tie-break below is exact.
            kth = scores[hits[top]].min()
            hits = hits[scores[hits] >= kth]
        order = np.lexsort((hits, -scores[hits]))
        return hits[order][:k].tolist()

    def search_many(self, queries: Sequence[str], k: int) -> list[list[int]]:
        return [self.search(q, k) for q in queries]

    @property
    def num_terms(self) -> int:
        return len(self._vocab)

    @property
    def nbytes(self) -> int:
        s = self._retriever.scores
        return int(s["data"].nbytes + s["indices"].nbytes + s["indptr"].nbytes)


def _top_k_positive(scores: np.ndarray, k: int) -> np.ndarray:
    """`search`'s selection in one compiled pass: the k best positive scores, ties by index.

    Same result as the NumPy path (flatnonzero, argpartition, lexsort) at a fraction of its cost:
    a size-k heap whose root is the worst kept document (lowest score, then highest index).
    Documents arrive in index order, so one that only ties the root is worse and is skipped.
    """
    heap_s = np.empty(k, scores.dtype)
    heap_i = np.empty(k, np.int64)
    size = 0
    for i in range(scores.shape[0]):
        s = scores[i]
        if s <= 0:
            continue
        if size < k:
            # sift up: the root must stay the worst (lowest score; among equals, highest index)
            j = size
            size += 1
            while j > 0:
                parent = (j - 1) // 2
                if heap_s[parent] < s or (heap_s[parent] == s and heap_i[parent] > i):
                    break
                heap_s[j] = heap_s[parent]
                heap_i[j] = heap_i[parent]
                j = parent
            heap_s[j] = s
            heap_i[j] = i
        elif s > heap_s[0]:
            j = 0
            while True:
                child = 2 * j + 1
                if child >= k:
                    break
                if child + 1 < k and (heap_s[child + 1] < heap_s[child] or (
                        heap_s[child + 1] == heap_s[child] and heap_i[child + 1] > heap_i[child])):
                    child += 1
                if s < heap_s[child] or (s == heap_s[child] and i > heap_i[child]):
                    break
                heap_s[j] = heap_s[child]
                heap_i[j] = heap_i[child]
                j = child
            heap_s[j] = s
            heap_i[j] = i
    heap_s = heap_s[:size]
    heap_i = heap_i[:size]
    # best first: score descending, then index ascending (a stable sort over index order)
    by_index = np.argsort(heap_i)
    heap_s = heap_s[by_index]
    heap_i = heap_i[by_index]
    order = np.argsort(-heap_s, kind="mergesort")
    return heap_i[order]


def _compile_top_k():
    try:
        import numba
    except ImportError:
        return None
    return numba.njit(cache=True, nogil=True)(_top_k_positive)


_top_k_jit = _compile_top_k()


def _has_numba() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True

