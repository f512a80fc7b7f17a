"""Text normalisation and search tokenisation, shared by indexing, queries and reward matching.

Chinese has no spaces, so CJK runs become overlapping character bigrams (a single character stays
a unigram); Latin words and numbers are kept whole. This is the tokenisation the SQLite FTS5 forks
of ShopSimulator use, so recall figures are comparable.
"""

from __future__ import annotations

import re
import unicodedata

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN_RE = re.compile(rf"[{_CJK}]+|[a-z0-9]+(?:\.[0-9]+[a-z0-9]*)?")
_CJK_RE = re.compile(rf"[{_CJK}]")

# Words that carry no product information in shopping requests; removed from queries and
# documents alike so they neither match nor dilute BM25 length normalisation.
STOPWORDS = frozenset(
    "a an and are as at be but by for from has have i i'm im in is it its looking me my need of on "
    "or please price than that the this to want with would like lower dollars dollar under buy "
    "find get some one".split()
)


def normalize(text: str) -> str:
    """NFKC + casefold: full-width forms and case never change a match."""
    return unicodedata.normalize("NFKC", text).casefold()


def tokenize(text: str) -> list[str]:
    """Search tokens of `text` (see module docstring); stopwords removed."""
    out: list[str] = []
    for run in _TOKEN_RE.findall(normalize(text)):
        if _CJK_RE.match(run):
            if len(run) == 1:
                out.append(run)
            else:
                out.extend(run[i : i + 2] for i in range(len(run) - 1))
        elif run not in STOPWORDS:
            out.append(run)
    return out


def has_cjk(text: str) -> bool:
    return _CJK_RE.search(text) is not None
