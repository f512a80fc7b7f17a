"""Pages as ShopSimulator text: visible text nodes joined with ' [SEP] '.

Buttons keep ShopSimulator's English labels in both languages (they are also the click values);
field labels follow the catalog language.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from sim.records import Product

SEP = " [SEP] "
BACK = "Back to Search"
NEXT = "Next >"
PREV = "< Prev"
BUY = "Buy Now"
DETAIL_PAGES = ("Description", "Features", "Reviews")

LABELS = {
    "en": {"price": "Price", "shop": "Shop", "selected": "Selected", "no_reviews": "No reviews yet.",
           "instruction": "Instruction:", "shopper": "Shopper", "search_ok": "Search available",
           "clickables": "Clickable buttons"},
    "zh": {"price": "价格", "shop": "店铺", "selected": "已选", "no_reviews": "暂无评价",
           "instruction": "Instruction:", "shopper": "Shopper", "search_ok": "搜索功能是否可用",
           "clickables": "可点击的按钮"},
}


def start_page(lang: str, instruction: str | None) -> str:
    if instruction is None:
        return SEP.join(("WebShop", "Search"))
    return SEP.join(("WebShop", LABELS[lang]["instruction"], instruction, "Search"))


def results_page(products: Sequence[Product], page: int, total: int, has_next: bool,
                 labels: Sequence[str] | None = None) -> str:
    """`labels` name the products (the buttons that open them); their asins by default."""
    parts = [BACK, f"Page {page} (Total results: {total})"]
    if page > 1:
        parts.append(PREV)
    if has_next:
        parts.append(NEXT)
    for p, label in zip(products, labels or [p.asin for p in products]):
        parts += (label, p.title, p.list_price_text)
    return SEP.join(parts)


def item_page(lang: str, product: Product, selected: Mapping[str, str], show_details: bool) -> str:
    lab = LABELS[lang]
    parts = [BACK, PREV]
    for axis, values in product.options.items():
        parts.append(axis)
        parts.extend(v.value for v in values)
    parts.append(product.title)
    parts.append(f"{lab['price']}: {product.price_text(selected)}")
    parts.append(f"{lab['shop']}: {product.shop}")
    if selected:
        parts.append(f"{lab['selected']}: " + "; ".join(f"{a}: {v}" for a, v in selected.items()))
    if show_details:
        parts.extend(DETAIL_PAGES)
    parts.append(BUY)
    return SEP.join(parts)


def detail_page(lang: str, product: Product, page: str) -> str:
    if page == "description":
        body = [product.description or product.title]
    elif page == "features":
        body = list(product.bullets) or list(product.attributes)
    else:
        body = [LABELS[lang]["no_reviews"]]
    return SEP.join((BACK, PREV, *body))


def affordances(lang: str, has_search_bar: bool, clickables: Sequence[str]) -> str:
    """The two lines ShopSimulator's service appends to every observation."""
    lab = LABELS[lang]
    shown = [c for c in clickables if c != "search"]
    return f"{lab['search_ok']}: {has_search_bar}\n{lab['clickables']}: {json.dumps(shown, ensure_ascii=False)}"
