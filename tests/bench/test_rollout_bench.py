"""The rollout benchmark runs end to end on a micro config: both engines play the same episodes and
the GRPO update is timed on the dense and the compact batch (the figures themselves come from the
bench command on a quiet machine)."""

import pytest

from intraskill_jax.bench import model as model_bench
from intraskill_jax.bench import rollout as bench
from intraskill_jax.models import ModelConfig


@pytest.fixture
def micro_size(monkeypatch: pytest.MonkeyPatch) -> str:
    micro = lambda: ModelConfig.tiny_qwen3_5(  # noqa: E731
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, layer_types=("linear_attention", "full_attention"),
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, linear_num_key_heads=1,
        linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16, tie_word_embeddings=True)
    monkeypatch.setitem(model_bench.SIZES, "micro", (micro, None))
    return "micro"


def test_both_engines_play_the_episodes_and_both_updates_are_timed(micro_size: str):
    result = bench.run(episodes=2, turns=2, new_tokens=4, size=micro_size, rounds=1, update_repeats=1)
    config = result["config"]
    # Random weights never stop early: every episode plays its whole turn budget on both sides.
    assert config["turns_played"] == config["turns_played_ref"] == 2 * 2
    assert config["sampler_weights"] == "auto"
    assert len(result["seconds_all"]) == len(result["seconds_all_ref"]) == 1
    assert result["speedup"] == pytest.approx(result["episodes_per_s"] / result["episodes_per_s_ref"])
    # The compact batch keeps the sampled targets only: at least the trained tokens, at most the row.
    rows, length = result["update_batch"]
    assert rows == 2 and result["update_trained_tokens"] <= rows * result["update_compact_targets"]
    assert result["update_compact_targets"] < length
    for name in ("update", "update_compact"):
        assert result[f"{name}_tokens_per_s"] == pytest.approx(result["update_tokens"] / result[f"{name}_seconds"])


def test_a_bfloat16_sampler_against_the_float32_reference_without_the_update(micro_size: str):
    """`--sampler-weights bfloat16` gives our side bfloat16 weight copies (as the SmolLM2 run samples),
    `--sampler` sets other fields of its config, and `--update-repeats 0` leaves the update out; the
    work both sides did is in the JSON."""
    settings = bench.parse_sampler_settings(["min_cache_length=128", "cache_growth=1.25", "decode_halvings=1",
                                              "prefill_buckets=16:32:64:128:256:512"])
    assert settings == {"min_cache_length": 128, "cache_growth": 1.25, "decode_halvings": 1,
                        "prefill_buckets": (16, 32, 64, 128, 256, 512)}
    result = bench.run(episodes=2, turns=2, new_tokens=4, size=micro_size, rounds=1, update_repeats=0,
                       sampler_weights="bfloat16", sampler_settings=settings)
    config = result["config"]
    assert config["sampler_weights"] == result["sampler"]["weight_dtype"] == "bfloat16"
    assert {name: result["sampler"][name] for name in settings} == settings
    assert config["turns_played"] == config["turns_played_ref"] == 2 * 2
    assert 0 < config["generated_tokens"] <= 2 * 2 * 4 and 0 < config["generated_tokens_ref"] <= 2 * 2 * 4
    assert not any(name.startswith("update") for name in result)


def test_the_skill_flag_puts_the_initial_bank_in_every_prompt_on_both_sides(micro_size: str):
    """`--skill`: both engines play the episodes with the run config's initial bank in the system
    prompt, so every episode is longer than bare by at least the bank's text."""
    from intraskill_jax import runconfig
    from intraskill_jax.skills.bank import SkillBank

    played = {skill: bench.run(episodes=2, turns=1, new_tokens=4, size=micro_size, rounds=1, update_repeats=0,
                               skill=skill)["config"] for skill in (False, True)}
    assert played[True]["skill"] and not played[False]["skill"]
    assert played[True]["turns_played"] == played[True]["turns_played_ref"] == 2
    bank = SkillBank.load(runconfig.RunConfig().skills.initial)
    words = sum(len(chunk.text("en").split()) for chunk in bank.active)
    # The bench's tokenizer is trained on the shop's titles: a word of the bank is one token or more.
    assert played[True]["final_tokens_per_episode"] - played[False]["final_tokens_per_episode"] >= words


def test_a_checkpoint_on_a_run_configs_shop_plays_the_same_episodes_on_both_sides(tmp_path):
    """`--model-path` with `--config`: both engines load the checkpoint's weights (not random ones)
    and play the config's shop and agent loop: greedy, the same weights give the same episodes."""
    from sim.world import build_world

    from tests.runs import SMOKE

    from intraskill_jax import policy, runconfig

    config = runconfig.load_file(SMOKE)
    base = policy.prepare_policy(config, tmp_path, build_world(config.sim))
    result = bench.run(episodes=2, turns=2, new_tokens=8, rounds=1, update_repeats=1, model_path=str(base),
                       config_path=SMOKE)
    played = result["config"]
    assert played["model_path"] == str(base) and played["run_config"] == SMOKE
    assert played["hidden"] == config.policy.init["hidden_size"]
    assert played["episodes_identical_to_ref"] == 2
    assert played["successes"] == played["successes_ref"]
    assert 2 <= played["turns_played"] <= 2 * 2


def test_the_sampler_benchmark_plays_the_same_episodes_with_each_setting(micro_size: str):
    """`bench.sampler`: float32 and bfloat16 samplers over the same weights (its default setting)
    play the same tasks in alternating rounds; the JSON says which was faster and whether this CPU
    multiplies bfloat16 in hardware (the verdict `weight_dtype = "bfloat16_if_native"` goes by)."""
    from intraskill_jax.bench import sampler
    from intraskill_jax.rollout.jax_sampler import native_bfloat16_products

    result = sampler.run(episodes=2, turns=2, new_tokens=4, size=micro_size, rounds=2)
    assert result["native_bfloat16"] is native_bfloat16_products()
    labels = ["weight_dtype=float32", "weight_dtype=bfloat16"]
    assert sorted(result["rounds"]) == sorted(labels)
    for label in labels:
        assert len(result["rounds"][label]) == 2
        # Random weights never stop early: every round plays the whole turn budget.
        assert all(r["turns"] == 2 * 2 and 0 < r["generated_tokens"] <= 2 * 2 * 4 for r in result["rounds"][label])
        assert result["best"][label]["seconds"] == min(r["seconds"] for r in result["rounds"][label])
    assert result["speedup"] == pytest.approx(result["best"][labels[0]]["seconds"] / result["best"][labels[1]]["seconds"])
    assert 0 <= result["identical_episodes"] <= 2


def test_the_sampler_benchmark_compares_a_shared_prefix_segment_on_skill_prompts(micro_size: str):
    """`--setting shared_prefix_slots=0,256 --skill`: the initial bank in every system prompt, the
    prefix copied into each row against held once; both play the same episodes, token for token."""
    from intraskill_jax.bench import sampler

    result = sampler.run(episodes=2, turns=2, new_tokens=4, size=micro_size, rounds=1,
                         setting="shared_prefix_slots=0,256", skill=True)
    assert result["config"]["skill"] and sorted(result["rounds"]) == ["shared_prefix_slots=0", "shared_prefix_slots=256"]
    assert result["identical_episodes"] == 2
    with pytest.raises(ValueError, match="NAME=A,B"):
        sampler.parse_setting("cache_growth=1.5")
    with pytest.raises(ValueError, match="'no_such_field' is not a field of rollout.sampler"):
        sampler.parse_setting("no_such_field=1,2")
    with pytest.raises(ValueError, match="cache_growth takes a float, got 'fast'"):
        bench.parse_sampler_settings(["cache_growth=fast"])
    with pytest.raises(ValueError, match="prefill_buckets takes ints joined by colons, got '32,64'"):
        bench.parse_sampler_settings(["prefill_buckets=32,64"])
    with pytest.raises(ValueError, match="NAME=VALUE"):
        bench.parse_sampler_settings(["cache_growth"])
    # A value of the right type that the sampler refuses fails before any model is built.
    with pytest.raises(ValueError, match="cache_growth > 1"):
        bench.setup_episodes(2, 1, 4, micro_size, "cpu", sampler_settings={"cache_growth": 0.5})


def test_the_sampler_benchmark_plays_drafted_tokens_greedy_and_sampled(monkeypatch: pytest.MonkeyPatch):
    """`--setting draft_tokens=0,3` on an attention-only model: greedy, the drafts leave the episodes
    as they were, and each round reports the drafted tokens its sampler kept; with `--temperature`
    the episodes are sampled and compared per generated token."""
    from intraskill_jax.bench import sampler

    monkeypatch.setitem(model_bench.SIZES, "micro_llama", (ModelConfig.tiny_llama, None))
    greedy = sampler.run(episodes=2, turns=2, new_tokens=8, size="micro_llama", rounds=1, setting="draft_tokens=0,3")
    assert greedy["identical_episodes"] == 2 and greedy["config"]["temperature"] == 0.0
    assert greedy["rounds"]["draft_tokens=0"][0]["drafted_tokens_kept"] == 0
    assert 0 <= greedy["rounds"]["draft_tokens=3"][0]["drafted_tokens_kept"] < greedy["best"]["draft_tokens=3"][
        "generated_tokens"]
    sampled = sampler.run(episodes=2, turns=2, new_tokens=8, size="micro_llama", rounds=1, setting="draft_tokens=0,3",
                          temperature=1.0)
    best = sampled["best"]
    per_token = [best[k]["seconds"] / best[k]["generated_tokens"] for k in ("draft_tokens=0", "draft_tokens=3")]
    assert sampled["speedup_per_token"] == pytest.approx(per_token[0] / per_token[1])
    assert sampled["config"]["temperature"] == 1.0
