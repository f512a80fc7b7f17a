"""Simulator options (ml-collections). Every field of `sim.config.SimConfig`, with its default.

    python -m sim demo --config=configs/sim.py --config.catalog.lang=zh
"""

import ml_collections

from sim.config import SimConfig


def get_config() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(SimConfig().to_dict())
