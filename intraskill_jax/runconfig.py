"""The run config: ml-collections files in `configs/` turned into typed, validated dataclasses.

A config file defines `get_config() -> ConfigDict` whose sections mirror `RunConfig`; every leaf
can be overridden on the command line (`--config.train.optim.learning_rate=1e-5`). `load` builds
the typed config before any expensive work: an unknown key is named with its nearest valid keys,
each section checks its own fields and `RunConfig` the rules that span sections, every error one
`ConfigError` line naming the field, the value and the fix.

Sections (each the dataclass of the part it configures):
  policy    where the policy comes from (an HF directory, or a fresh tiny model built here)
  sim       the simulator (sim.config.SimConfig)
  agent     episode limits and rendering (agent.episode.AgentConfig); the tool-call format follows
            the policy's model family (`RunConfig.for_policy`)
  rollout   the engine (embedded JAX sampler or an SGLang server) and sampling
  sft       the supervised warm start on oracle demonstrations
  train     GRPO: rounds x gate_every steps, groups, optimizer, loss (rl.learner.TrainConfig, which
            the learner reads as it is)
  skills    the bank, group masks, retry, gate and analysts (mode: coevolve / fixed / none);
            chunks are rendered in the catalog's language (sim.catalog.lang)
  eval      the test conditions
  mesh      the device mesh
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from sim.config import SimConfig

from intraskill_jax.agent.episode import AgentConfig
from intraskill_jax.errors import ConfigError
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models.params import checkpoint_family
from intraskill_jax.models.sharding import MeshConfig
from intraskill_jax.rl.learner import TrainConfig
from intraskill_jax.rl.sft import SFTConfig
from intraskill_jax.rollout.base import SamplingParams
from intraskill_jax.rollout.jax_sampler import SamplerConfig
from intraskill_jax.skills.analysts import ANALYSTS, AnalystsConfig
from intraskill_jax.skills.gate import GateConfig
from intraskill_jax.skills.masks import MaskConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    """Attributes:
      path: HF checkpoint directory (config.json, safetensors, tokenizer files). Empty: build a
        fresh Qwen3.5-architecture model from `init` and a BPE tokenizer trained on the
        simulator's text, saved as an HF directory under `<workdir>/base/` and loaded from there
        through the same path a real checkpoint takes.
      init: `ModelConfig` fields over `ModelConfig.tiny_qwen3_5` for the fresh model.
      tokenizer_vocab_size: vocabulary of the tokenizer trained for the fresh model.
      chat_template: the fresh tokenizer's chat template: 'full' (the family's tool preamble, ~300
        tokens) or 'compact' (one line of tool signatures and the call format, ~40 tokens). A
        checkpoint from `path` always brings its own template.
      dtype: compute dtype; 'auto' is float32 on CPU and bfloat16 on GPU/TPU.
      remat: activation checkpointing of the decoder layers ('none', 'full', 'minimal',
        'dots_saveable'; `ModelConfig.remat`).
      scan_layers: run the layers as one `lax.scan` over repeats of the layer pattern in the
        trainer's programs (`ModelConfig.scan_layers`): compiles one period instead of every
        layer; the parameters and checkpoints are the same either way.
      gdn_chunk_size, attention_block_size, cache_block_size: kernel shapes (`ModelConfig`); 64, 0
        and 0 suit GPU/TPU, a CPU run is ~2x faster with 16 and 128 (cache_block_size: README, Models).
      transpose_decode_weights: the sampler multiplies by [in, out] weight copies (`ModelConfig`); for CPU.
    """

    path: str = ""
    init: dict[str, Any] = dataclasses.field(default_factory=dict)
    tokenizer_vocab_size: int = 2048
    chat_template: Literal["full", "compact"] = "full"
    dtype: str = "auto"
    remat: str = "none"
    scan_layers: bool = False
    gdn_chunk_size: int = 64
    attention_block_size: int = 0
    cache_block_size: int = 0
    transpose_decode_weights: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "float32", "bfloat16"):
            raise ConfigError(f"policy.dtype must be auto, float32 or bfloat16, got {self.dtype!r}")
        if self.chat_template not in ("full", "compact"):
            raise ConfigError(f"policy.chat_template must be 'full' or 'compact', got {self.chat_template!r}")

    def model_overrides(self) -> dict[str, Any]:
        """The `ModelConfig` fields this section sets on whatever checkpoint it loads (numerics aside)."""
        return {"remat": self.remat, "scan_layers": self.scan_layers, "gdn_chunk_size": self.gdn_chunk_size,
                "attention_block_size": self.attention_block_size, "cache_block_size": self.cache_block_size,
                "transpose_decode_weights": self.transpose_decode_weights}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """Attributes:
      engine: 'jax' (the embedded sampler, in process) or 'sglang' (an HTTP server at `url`).
      url: the SGLang (or `intraskill serve`) server.
      sampler: the embedded sampler's cache and compile buckets.
      sampling: rollout sampling; the temperature is also the trainer's scoring temperature.
      max_concurrent: episodes in flight at once; 0 means the sampler's max_batch (jax) or 64
        (sglang, whose server batches continuously).
    """

    engine: Literal["jax", "sglang"] = "jax"
    url: str = "http://127.0.0.1:30000"
    max_concurrent: int = 0
    sampler: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)
    sampling: SamplingParams = dataclasses.field(default_factory=lambda: SamplingParams(temperature=1.0, max_new_tokens=256))

    def __post_init__(self) -> None:
        if self.engine not in ("jax", "sglang"):
            raise ConfigError(f"rollout.engine must be 'jax' or 'sglang', got {self.engine!r}")
        if self.max_concurrent < 0:
            raise ConfigError(f"rollout.max_concurrent must be >= 0, got {self.max_concurrent}")

    @property
    def capacity(self) -> int:
        if self.max_concurrent:
            return self.max_concurrent
        return self.sampler.max_batch if self.engine == "jax" else 64


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmStartConfig:
    """Attributes:
      enabled: run SFT on oracle demonstrations before GRPO.
      num_demos: demonstrations (training tasks, in the data order).
      sft: the supervised update (optimizer, batch, epochs).
      heldout_demos: validation tasks whose oracle runs score the warm start afterwards: per
        action kind, the chance it samples the oracle's reply (metrics `eval/sft_agree_<kind>`).
      recovery_share: the share of the demonstrations that first make a policy's mistake and then
        recover from it (`sim.policies.RecoveringOraclePolicy`: a `buy now` with an option axis
        unchosen, or a product lacking a requested value opened and left with `< prev`; half
        each). The mistaken replies stay in the context and out of the loss.
    """

    enabled: bool = False
    num_demos: int = 256
    heldout_demos: int = 32
    recovery_share: float = 0.0
    sft: SFTConfig = dataclasses.field(default_factory=SFTConfig)

    def __post_init__(self) -> None:
        if not 0.0 <= self.recovery_share <= 1.0:
            raise ValueError(f"warm_start.recovery_share must be in [0, 1], got {self.recovery_share}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SkillsConfig:
    """Attributes:
      mode: 'coevolve' (masks, retry, gate, analysts), 'fixed' (the initial bank, never changed)
        or 'none' (plain GRPO: no skill text ever).
      initial: the skill directory of round 0 (relative paths resolve against the repository).
      retry: retry all-wrong groups once with the full skill.
      validation_tasks: validation tasks per gate (the first n of the validation split).
      max_failures_analysed: remaining failures per round sent to the analysts (a seeded sample).
      analyst: 'offline' (failure taxonomy, no LLM) or 'openai' (a chat endpoint at analyst_url).
    """

    mode: Literal["coevolve", "fixed", "none"] = "coevolve"
    initial: str = "skills/s0"
    retry: bool = True
    validation_tasks: int = 100
    max_failures_analysed: int = 64
    masks: MaskConfig = dataclasses.field(default_factory=MaskConfig)
    gate: GateConfig = dataclasses.field(default_factory=GateConfig)
    analysts: AnalystsConfig = dataclasses.field(default_factory=AnalystsConfig)
    analyst: Literal["offline", "openai"] = "offline"
    analyst_url: str = "http://127.0.0.1:30000/v1"
    analyst_model: str = "default"

    def __post_init__(self) -> None:
        if self.mode not in ("coevolve", "fixed", "none"):
            raise ConfigError(f"skills.mode must be coevolve, fixed or none, got {self.mode!r}")
        if self.analyst not in ANALYSTS:
            raise ConfigError(f"skills.analyst must be one of {sorted(ANALYSTS)}, got {self.analyst!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Attributes:
      num_tasks: test tasks (the first n of the test split), the same for every condition.
      conditions: which of base_bare, base_skill, trained_bare, trained_skill to run, and
        optionally pretrained_bare / pretrained_skill: the starting checkpoint before the warm start
        (zero-shot), bare and with the initial bank.
      sampling: evaluation sampling (one completed rollout per task and condition).
      seed: sampling seed (the same for every condition, so the conditions are paired).
    """

    num_tasks: int = 400
    conditions: tuple[str, ...] = ("base_bare", "base_skill", "trained_bare", "trained_skill")
    sampling: SamplingParams = dataclasses.field(default_factory=lambda: SamplingParams(temperature=1.0, max_new_tokens=256))
    seed: int = 1234

    def __post_init__(self) -> None:
        bad = set(self.conditions) - set(CONDITIONS) - set(PRETRAINED_CONDITIONS)
        if bad:
            raise ConfigError(f"eval.conditions: unknown {sorted(bad)}; known: "
                              f"{list(CONDITIONS) + list(PRETRAINED_CONDITIONS)}")


CONDITIONS = ("base_bare", "base_skill", "trained_bare", "trained_skill")
# The checkpoint the run starts from, before any warm start: what SFT and training add to it.
PRETRAINED_CONDITIONS = ("pretrained_bare", "pretrained_skill")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    name: str = "run"
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig)
    sim: SimConfig = dataclasses.field(default_factory=SimConfig)
    agent: AgentConfig = dataclasses.field(default_factory=AgentConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    warm_start: WarmStartConfig = dataclasses.field(default_factory=WarmStartConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    skills: SkillsConfig = dataclasses.field(default_factory=SkillsConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)

    def __post_init__(self) -> None:
        """The rules that span sections, so a run that cannot finish stops here, before any work."""
        temperature = self.rollout.sampling.temperature
        if temperature <= 0:
            raise ConfigError(f"rollout.sampling.temperature={temperature}: GRPO scores each rollout at its sampling "
                              "temperature and greedy rollouts have no log-prob ratio; set it > 0 (e.g. 1.0)")
        splits = self.sim.splits
        # Splits.make carves exactly num_test and num_validation tasks (or fails when the catalog is
        # too small), so the split sizes are known here, before the world is built.
        skills, ws = self.skills, self.warm_start
        drawn = (("skills.validation_tasks", skills.validation_tasks, skills.mode == "coevolve", "validation"),
                 ("warm_start.heldout_demos", ws.heldout_demos, ws.enabled, "validation"),
                 ("eval.num_tasks", self.eval.num_tasks, True, "test"))
        for field, n, used, split in drawn:
            size = getattr(splits, f"num_{split}")
            if used and n > size:
                raise ConfigError(f"{field}={n} but the {split} split has sim.splits.num_{split}={size} tasks; "
                                  "lower the first or raise the second")

    def for_policy(self, path: str | Path) -> RunConfig:
        """This config completed by the policy at `path` (an HF directory): the agent writes and
        parses tool calls in the format of the model family its config.json names."""
        family = checkpoint_family(path)
        chosen = self.agent.tool_format
        if chosen is not None and chosen != family.tool_format:
            raise ConfigError(f"agent.tool_format={chosen!r} but the policy at {path} is model family {family.name!r}, "
                              f"whose tool calls are {family.tool_format!r}; drop agent.tool_format (it follows the "
                              "policy) or load a policy that writes that format")
        self._check_lora_targets(path)
        return dataclasses.replace(self, agent=dataclasses.replace(self.agent, tool_format=family.tool_format))

    def _check_lora_targets(self, path: str | Path) -> None:
        """The adapters' targets against the policy's linear layers, before the warm start or the first
        step (the model is only traced, nothing is allocated)."""
        stages = [("train.lora", self.train.lora)]
        if self.warm_start.enabled:
            stages.append(("warm_start.sft.lora", self.warm_start.sft.lora))
        stages = [(where, lora) for where, lora in stages if lora.enabled]
        if not stages:
            return
        from flax import nnx

        from intraskill_jax.models import causal_lm_class, config_from_file

        model_config = config_from_file(path)
        model = nnx.eval_shape(lambda: causal_lm_class(model_config)(model_config, rngs=nnx.Rngs(0)))
        for where, lora in stages:
            try:
                lora_lib.check_targets(lora, model)
            except ValueError as e:
                raise ConfigError(f"{where}.{e} (the policy at {path}); fix {where}.targets") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)


def from_mapping(cls: type, values: Any, where: str = "config") -> Any:
    """Builds dataclass `cls` from a nested mapping; unknown keys and wrong shapes are errors."""
    if isinstance(values, cls):
        return values
    if cls is SimConfig:
        try:
            return SimConfig.from_mapping(values)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    if not isinstance(values, Mapping) and not hasattr(values, "keys"):
        raise ConfigError(f"{where} must be a mapping of {cls.__name__} fields, got {type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values.keys()) - set(fields))
    if unknown:
        raise unknown_key(f"{where}.{unknown[0]}", [f"{where}.{name}" for name in fields])
    kwargs = {k: _convert(hints[k], values[k], f"{where}.{k}") for k in values.keys()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return from_mapping(hint, value, where)
    if origin is tuple:
        return tuple(value)
    if origin is dict or hint is dict:
        return dict(value)
    if origin in (typing.Union, types.UnionType) and value is not None:
        inner = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(inner[0], value, where) if len(inner) == 1 else value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def load(config: Any) -> RunConfig:
    """A `RunConfig` from a ConfigDict / mapping (e.g. what `config_flags` parsed)."""
    if isinstance(config, RunConfig):
        return config
    mapping = config.to_dict() if hasattr(config, "to_dict") else config
    return from_mapping(RunConfig, mapping, "config")


def unknown_key(key: str, known: Iterable[str]) -> ConfigError:
    """The error for a key no config has, naming the nearest keys that exist (a misspelling)."""
    nearest = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
    hint = f"nearest: {', '.join(nearest)}" if nearest else "see configs/*.py and intraskill_jax/runconfig.py"
    return ConfigError(f"{key}: no such config key; {hint}")


def check_keys(config: Any, keys: Iterable[str]) -> None:
    """Raises `unknown_key` for the first of the dotted `keys` (`train.group_size`) that is not a
    field or section of `config` (a ConfigDict or mapping, as a config file's `get_config()` gives)."""
    known = set(_dotted(config.to_dict() if hasattr(config, "to_dict") else config))
    for key in keys:
        if key not in known:
            raise unknown_key(key, sorted(known))


def _dotted(values: Mapping[str, Any], prefix: str = "") -> Iterable[str]:
    for name, value in values.items():
        yield prefix + name
        if isinstance(value, Mapping):
            yield from _dotted(value, f"{prefix}{name}.")


def read_file(path: str | Path) -> Any:
    """The ConfigDict of a config file (`configs/<name>.py`, its `get_config()`), unconverted;
    `configs/<name>.py:<preset>` passes the preset to `get_config`, as `--config=` does. A file
    that takes presets lists them in `PRESETS`."""
    text = str(path)
    preset = None
    if not Path(text).is_file() and ":" in text:
        text, preset = text.rsplit(":", 1)
    module = _config_module(Path(text))
    known = tuple(getattr(module, "PRESETS", ()))
    if preset is not None and preset not in known:
        listed = f"known: {', '.join(known)}" if known else "it takes none"
        raise ConfigError(f"{text}: unknown preset {preset!r}; {listed}")
    try:
        return module.get_config() if preset is None else module.get_config(preset)
    except ValueError as e:
        raise ConfigError(f"{text}:{preset}: {e}") from None


def presets_of(path: str | Path) -> tuple[str, ...]:
    """The presets a config file lists in its `PRESETS` (none for a file without)."""
    return tuple(getattr(_config_module(Path(path)), "PRESETS", ()))


def _config_module(path: Path) -> types.ModuleType:
    import importlib.util

    if not path.is_file():
        raise ConfigError(f"config file {path} not found")
    spec = importlib.util.spec_from_file_location(f"_intraskill_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    if not hasattr(module, "get_config"):
        raise ConfigError(f"{path} defines no get_config()")
    return module


def load_file(path: str | Path) -> RunConfig:
    """Loads a config file (`read_file`) outside absl's flag parsing."""
    return load(read_file(path))


def with_overrides(config: RunConfig, overrides: Mapping[str, Any]) -> RunConfig:
    """`config` with dotted fields replaced (`{"train.rounds": 1}`), checked like a loaded config."""
    values = config.to_dict()
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = values
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise ConfigError(f"override {key!r}: {part!r} is not a config section")
            node = node[part]
        node[leaf] = value
    return load(values)


def resolve_repo_path(path: str) -> str | Path:
    """A config path: a URL (gs://..., returned as it is: `Path` would collapse its `//`), absolute,
    relative to the current directory, or to the repository root."""
    if "://" in path:
        return path
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    repo = Path(__file__).resolve().parent.parent / p
    return repo if repo.exists() else p
