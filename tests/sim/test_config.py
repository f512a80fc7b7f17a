import ml_collections
import pytest

from sim.config import ConfigError, SimConfig
from sim.world import Splits


def test_configs_file_round_trips_every_default():
    from configs.sim import get_config

    cfg = get_config()
    assert isinstance(cfg, ml_collections.ConfigDict)
    assert SimConfig.from_mapping(cfg) == SimConfig()


@pytest.mark.parametrize(
    "override, message",
    [
        ({"catalog": {"lang": "fr"}}, "catalog.lang"),
        ({"env": {"mode": "chat"}}, "env.mode"),
        ({"env": {"page_size": 0}}, "env.page_size"),
        ({"search": {"b": 2.0}}, "search.b"),
        ({"catalog": {"num_prodcts": 5}}, "unknown field"),
        ({"catalgo": {}}, "unknown sim config section"),
        ({"catalog": {"instructions_path": "x.json"}}, "needs catalog.items_path"),
    ],
)
def test_bad_config_names_the_field(override, message):
    with pytest.raises(ConfigError, match=message):
        SimConfig.from_mapping(override)


def test_too_small_catalog_for_the_splits_is_a_clear_error():
    with pytest.raises(ValueError, match="raise catalog.num_products"):
        Splits.make(100, 80, 30, seed=0)
