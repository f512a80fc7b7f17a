"""The attention benchmark at a tiny shape: both sides timed, their gradients equal."""

import json

from intraskill_jax.bench import attention


def test_both_sides_are_timed_and_their_gradients_agree(capsys):
    attention.main(["--json", "--tokens=40", "--block-size=16,32", "--rows=2", "--heads=4", "--kv-heads=2",
                    "--head-dim=8", "--rounds=2"])
    result = json.loads(capsys.readouterr().out)
    assert [(c["tokens"], c["block_size"]) for c in result["cases"]] == [(40, 16), (40, 32)]
    for case in result["cases"]:
        assert case["grad_rel_diff"] < 1e-5
        assert case["ours_ms"] > 0 and case["torch_sdpa_ms"] > 0
        assert case["speedup_vs_torch_sdpa"] == case["torch_sdpa_ms"] / case["ours_ms"]
    assert len(result["load_before"]) == 3 and len(result["load_after"]) == 3
