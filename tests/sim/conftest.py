"""Small shared worlds: built once per session, read-only like the real one."""

import pytest

from sim.config import CatalogConfig, SimConfig, SplitConfig
from sim.world import World, build_world


def small_config(lang: str = "en", **catalog) -> SimConfig:
    return SimConfig(
        catalog=CatalogConfig(num_products=2400, lang=lang, persona_fraction=0.5, **catalog),
        splits=SplitConfig(num_test=100, num_validation=100),
    )


@pytest.fixture(scope="session")
def world_en() -> World:
    return build_world(small_config("en"))


@pytest.fixture(scope="session")
def world_zh() -> World:
    return build_world(small_config("zh"))


@pytest.fixture(scope="session", params=["en", "zh"])
def world(request, world_en, world_zh) -> World:
    return world_en if request.param == "en" else world_zh
