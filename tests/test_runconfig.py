"""The run config: every file in configs/ with every preset it lists converts; every bad value is
one ConfigError line at load (naming the field, the value and the fix) before anything runs; a
misspelt key names its nearest keys, on the command line and in a mapping alike."""

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.config import SimConfig

from intraskill_jax import checkpoint, errors, main, presets, runconfig
from intraskill_jax.models import params
from intraskill_jax.rl.learner import TrainConfig

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.py"))
SMOKE = f"{REPO / 'configs' / 'quickstart.py'}:smoke"


def _every_file_and_preset():
    for path in CONFIGS:
        for preset in (None, *runconfig.presets_of(path)):
            yield pytest.param(path, preset, id=f"{path.name}:{preset}" if preset else path.name)


@pytest.mark.parametrize("path,preset", list(_every_file_and_preset()))
def test_every_config_file_and_preset_converts(path, preset):
    config = runconfig.read_file(path if preset is None else f"{path}:{preset}")
    if set(config.keys()) <= {f for f in SimConfig.__dataclass_fields__}:  # configs/sim.py: `python -m sim`
        assert isinstance(SimConfig.from_mapping(config.to_dict()), SimConfig)
        return
    run = runconfig.load(config)
    assert isinstance(run.train, TrainConfig)
    expected_mode = {"plain_grpo": "none", "fixed_skill": "fixed"}.get(preset, "coevolve")
    assert run.skills.mode == expected_mode
    if preset in ("fixed_skill", "no_mask"):  # every group sees every active chunk
        m = run.skills.masks
        assert (m.skill_free, m.prior, m.floor, m.ceiling) == (0.0, 1.0, 1.0, 1.0)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_a_file_that_takes_a_preset_lists_its_presets(path):
    module = runconfig._config_module(path)
    takes_preset = bool(inspect.signature(module.get_config).parameters)
    assert takes_preset == bool(runconfig.presets_of(path))
    if takes_preset:
        assert set(presets.PRESETS) <= set(runconfig.presets_of(path))


def test_unknown_preset_lists_the_files_presets():
    with pytest.raises(runconfig.ConfigError, match=r"unknown preset 'bogus'; known: coevolve, .*, smoke$"):
        runconfig.read_file(f"{REPO / 'configs' / 'quickstart.py'}:bogus")
    with pytest.raises(runconfig.ConfigError, match=r"unknown preset 'x'; it takes none"):
        runconfig.read_file(f"{REPO / 'configs' / 'sim.py'}:x")


# Each bad value against the smoke preset (20 validation and 20 test tasks, warm start on), with
# the words its one line must hold: the field, the value, and the fix.
BAD = {
    "group_size": ({"train.group_size": 1}, ["train.group_size=1", "set train.group_size to 2 or more"]),
    "temperature": ({"rollout.sampling.temperature": 0.0},
                    ["rollout.sampling.temperature=0.0", "greedy", "set it > 0"]),
    "validation_tasks": ({"skills.validation_tasks": 21},
                         ["skills.validation_tasks=21", "sim.splits.num_validation=20", "raise the second"]),
    "heldout_demos": ({"warm_start.heldout_demos": 21},
                      ["warm_start.heldout_demos=21", "sim.splits.num_validation=20"]),
    "eval_tasks": ({"eval.num_tasks": 21}, ["eval.num_tasks=21", "sim.splits.num_test=20"]),
    "lora_rank": ({"train.lora.rank": 0}, ["config.train.lora", "rank=0", "set rank to 1 or more"]),
    "sft_lora_targets": ({"warm_start.sft.lora.targets": ("q_proj", "lm_head")},
                         ["config.warm_start.sft.lora", "['lm_head']", "drop it from targets"]),
    "lora_alpha": ({"warm_start.sft.lora.alpha": -1.0}, ["config.warm_start.sft.lora", "alpha=-1.0", "must be > 0"]),
    "checkpoint_every": ({"train.checkpoint_every": 0}, ["train.checkpoint_every=0", "must be >= 1"]),
}


@pytest.mark.parametrize("name", BAD)
def test_bad_values_fail_at_load_naming_field_value_and_fix(name):
    overrides, words = BAD[name]
    with pytest.raises(runconfig.ConfigError) as err:
        runconfig.with_overrides(runconfig.load_file(SMOKE), overrides)
    message = str(err.value)
    assert "\n" not in message and all(w in message for w in words), message


def test_rules_that_hold_only_where_they_matter():
    smoke = runconfig.load_file(SMOKE)
    # The gate draws validation tasks in co-evolution mode only, the warm start its held-out ones
    # only when it runs: elsewhere a larger number is unused, not an error.
    runconfig.with_overrides(smoke, {"skills.mode": "fixed", "skills.validation_tasks": 21})
    runconfig.with_overrides(smoke, {"warm_start.enabled": False, "warm_start.heldout_demos": 21})
    edge = runconfig.with_overrides(smoke, {"skills.validation_tasks": 20, "eval.num_tasks": 20,
                                            "train.group_size": 2, "train.loss.kl_coef": 0.0})
    assert edge.skills.validation_tasks == 20 and edge.train.group_size == 2
    # LoRA is off by default in both stages; a KL penalty loads (the learner scores a reference).
    assert not smoke.train.lora.enabled and not smoke.warm_start.sft.lora.enabled
    lora = runconfig.with_overrides(smoke, {"train.loss.kl_coef": 0.05, "train.lora.enabled": True,
                                            "train.lora.targets": ["q_proj", "v_proj"], "warm_start.sft.lora.rank": 4})
    assert lora.train.loss.kl_coef == 0.05 and lora.train.lora.targets == ("q_proj", "v_proj")
    assert lora.warm_start.sft.lora.rank == 4 and lora.warm_start.sft.lora.scale == 4.0
    with pytest.raises(runconfig.ConfigError, match=r"^train\.lora\.rnak: no such config key; nearest: train\.lora\.rank"):
        main.check_overrides([f"--config={SMOKE}", "--config.train.lora.rnak=4"])


def test_a_misspelt_override_names_the_nearest_keys():
    with pytest.raises(runconfig.ConfigError) as err:
        main.check_overrides([f"--config={SMOKE}", "--config.train.grup_size=2"])
    assert str(err.value).startswith("train.grup_size: no such config key; nearest: train.group_size")
    # absl's other spellings: `--config FILE` and a boolean's `--noconfig.KEY`.
    with pytest.raises(runconfig.ConfigError, match=r"^train\.scale_by_sd: .*nearest: train\.scale_by_std"):
        main.check_overrides(["--config", SMOKE, "--noconfig.train.scale_by_sd"])
    main.check_overrides([f"--config={SMOKE}", "--config.train.group_size=2", "--noconfig.train.scale_by_std",
                          "--config.policy.init.hidden_size=32"])  # known keys, sections' and dicts' alike


def test_a_misspelt_key_in_a_mapping_names_the_nearest_keys():
    values = runconfig.load_file(SMOKE).to_dict()
    values["rollout"]["sampling"]["temprature"] = 1.0
    with pytest.raises(runconfig.ConfigError, match=r"^config\.rollout\.sampling\.temprature: no such config key; "
                                                    r"nearest: config\.rollout\.sampling\.temperature"):
        runconfig.load(values)


@pytest.mark.parametrize("override,words", [
    ("--config.train.group_size=1", ["intraskill train: train.group_size=1", "set train.group_size to 2"]),
    ("--config.train.grup_size=2", ["intraskill train: train.grup_size: no such config key",
                                    "nearest: train.group_size"]),
])
def test_the_cli_stops_with_one_line_and_writes_nothing(tmp_path, override, words):
    workdir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "intraskill_jax.cli", "train", f"--config={SMOKE}",
                           f"--workdir={workdir}", override],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), done.stderr
    assert not workdir.exists()


def test_one_error_class_per_kind():
    assert runconfig.ConfigError is errors.ConfigError
    with pytest.raises(runconfig.ConfigError, match="catalog.num_products"):  # raised inside sim/
        runconfig.with_overrides(runconfig.load_file(SMOKE), {"sim.catalog.num_products": 0})
    assert checkpoint.CheckpointError is params.CheckpointError is errors.CheckpointError


def test_lora_targets_are_checked_against_the_policy_before_any_work(tmp_path):
    from intraskill_jax.models import ModelConfig, hf_config

    (tmp_path / "config.json").write_text(json.dumps(hf_config(ModelConfig.tiny_qwen3())))
    smoke = runconfig.load_file(SMOKE)
    assert smoke.warm_start.enabled
    ok = runconfig.with_overrides(smoke, {"train.lora.enabled": True, "warm_start.sft.lora.enabled": True})
    assert ok.for_policy(tmp_path).agent.tool_format == "json"
    for where in ("train.lora", "warm_start.sft.lora"):
        bad = runconfig.with_overrides(smoke, {f"{where}.enabled": True, f"{where}.targets": ["q_proj", "in_proj_qkv"]})
        with pytest.raises(runconfig.ConfigError) as err:
            bad.for_policy(tmp_path)
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"{where}.targets names ['in_proj_qkv']"), message
        assert "'up_proj'" in message and f"fix {where}.targets" in message
    # The warm start's adapters are not checked when it does not run.
    runconfig.with_overrides(smoke, {"warm_start.enabled": False, "warm_start.sft.lora.enabled": True,
                                     "warm_start.sft.lora.targets": ["nothing"]}).for_policy(tmp_path)
