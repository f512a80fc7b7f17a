"""Wire constants of ShopSimulator's service, shared by `sim.server` and `sim.client`.

Kept free of heavy imports so a client process never loads the catalog or search code.
"""

from __future__ import annotations

API_PATH = "/api/shop_agent"
ACTION_MARKER = "\nAction: "
NO_SLOT_MESSAGE = "Unable to get available environment resource, please try again later"


def extract_action(response: str) -> str:
    """The env action inside a raw model turn, cut exactly as ShopSimulator's service cuts it.

    A literal backslash-n counts as a newline, then the action is the text between the first
    "\\nAction: " and the next one (upstream's `split("\\nAction: ")[1]`), else the whole text.
    """
    text = response.replace("\\n", "\n")
    if ACTION_MARKER in text:
        return text.split(ACTION_MARKER)[1]
    return text
