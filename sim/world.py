"""The shared, read-only world every environment reads: catalog, tasks, splits, search index."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from sim.config import SimConfig
from sim.records import Catalog
from sim.search import SearchIndex

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Splits:
    """Task ids of each split: a seeded permutation, test carved first, then validation.

    Each split keeps the permutation's order, so any prefix (`test[:n]`, `train[:n]`) is a
    uniform sample of its split. Task ids follow the catalog, whose neighbours are near-identical
    products; a sorted split's prefix would hold only the first few product types.
    """

    train: np.ndarray
    validation: np.ndarray
    test: np.ndarray

    @classmethod
    def make(cls, num_tasks: int, num_test: int, num_validation: int, seed: int) -> Splits:
        if num_test + num_validation >= num_tasks:
            raise ValueError(
                f"splits need more tasks than test ({num_test}) + validation ({num_validation}); the "
                f"catalog has {num_tasks}: lower splits.num_test/num_validation or raise catalog.num_products"
            )
        perm = np.random.default_rng(seed).permutation(num_tasks)
        test = perm[:num_test]
        val = perm[num_test : num_test + num_validation]
        train = perm[num_test + num_validation :]
        return cls(train=train, validation=val, test=test)

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in ("train", "validation", "test"):
            raise KeyError(f"unknown split {name!r}; use 'train', 'validation' or 'test'")
        return getattr(self, name)


@dataclasses.dataclass(frozen=True)
class World:
    config: SimConfig
    catalog: Catalog
    index: SearchIndex
    splits: Splits


def load_catalog(config: SimConfig) -> Catalog:
    cat = config.catalog
    if cat.items_path:
        from sim.loaders import load_items

        return load_items(cat)
    from sim.catalog import SyntheticCatalog

    return SyntheticCatalog(cat)


def build_world(config: SimConfig | None = None, *, progress: bool = False) -> World:
    """Builds the catalog and its index once; share the result across all environments."""
    config = config or SimConfig()
    catalog = load_catalog(config)
    index = SearchIndex.build(iter(catalog), config.search, num_docs=len(catalog), progress=progress)
    splits = Splits.make(len(catalog.tasks), config.splits.num_test, config.splits.num_validation, config.splits.seed)
    return World(config=config, catalog=catalog, index=index, splits=splits)
