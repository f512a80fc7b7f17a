"""The agent's system prompt: base instructions, then the skill text, then the profile.

An empty skill renders nothing at all (no header, no blank line), so "bare" and "all chunks off"
are byte-identical prompts.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_BASE = {
    "en": {
        "single": (
            "You are a shopping assistant in an online shop. Find the product that satisfies the user's "
            "request and buy it with the right options, using the tools: search on the search page, click "
            "buttons shown on the page, and click 'buy now' on the product page to finish. Call exactly one "
            "tool per turn."
        ),
        "multi": (
            "You are a shopping assistant in an online shop, talking with a shopper. Ask the shopper about "
            "what they need (ask_shopper), find a product that satisfies every requirement, confirm before "
            "buying, then buy it with the right options (click 'buy now'). Call exactly one tool per turn."
        ),
        "profile": "The shopper's profile:",
    },
    "zh": {
        "single": "你是网店的购物助手。使用工具找到满足用户需求的商品，并选好规格后购买：在搜索页搜索，点击页面上的按钮，在商品页点击 'buy now' 完成购买。每轮只调用一个工具。",
        "multi": "你是网店的购物助手，正在与顾客对话。先询问顾客的需求（ask_shopper），找到满足所有要求的商品，购买前与顾客确认，再选好规格购买（点击 'buy now'）。每轮只调用一个工具。",
        "profile": "顾客的个人档案：",
    },
}


def system_prompt(lang: str, mode: str, skill_text: str = "", profile: Mapping[str, Any] | None = None) -> str:
    parts = [_BASE[lang][mode]]
    if skill_text:
        parts.append(skill_text)
    if profile is not None:
        parts.append(_BASE[lang]["profile"] + "\n" + json.dumps(profile, ensure_ascii=False))
    return "\n\n".join(parts)
