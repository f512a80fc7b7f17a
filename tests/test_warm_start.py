"""Which demonstrations of the warm start recover from a mistake (`warm_start.recovery_share`)."""

import collections

import numpy as np
import pytest

from intraskill_jax.runconfig import WarmStartConfig
from intraskill_jax.warm_start import recovery_mistakes


def test_a_share_of_the_demonstrations_make_each_mistake_in_turn_and_the_draw_is_seeded():
    drawn = recovery_mistakes(48, 0.25, np.random.default_rng(7))
    assert len(drawn) == 48
    assert collections.Counter(drawn) == {None: 36, "buy_early": 6, "wrong_product": 6}
    assert drawn == recovery_mistakes(48, 0.25, np.random.default_rng(7))
    assert drawn != recovery_mistakes(48, 0.25, np.random.default_rng(8))
    assert recovery_mistakes(48, 0.0, np.random.default_rng(7)) == [None] * 48
    assert None not in recovery_mistakes(5, 1.0, np.random.default_rng(7))


@pytest.mark.parametrize("share", [-0.1, 1.5])
def test_a_share_outside_zero_to_one_is_refused(share):
    with pytest.raises(ValueError, match="recovery_share"):
        WarmStartConfig(recovery_share=share)
