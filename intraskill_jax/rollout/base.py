"""The rollout engine protocol and its records.

An engine turns token prompts into sampled token ids with their log-probs. Requests carry a
`session` key: an engine may keep per-session state (the embedded sampler keeps the KV/recurrent
cache of an episode between turns, so a new turn pre-fills only its new tokens; SGLang's radix
cache does the same on its side). `release` drops that state when an episode ends.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from etils import epath

FinishReason = Literal["stop", "length"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """Sampling options; log-probs are always those of the temperature-scaled distribution."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    max_new_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_new_tokens < 1:
            raise ValueError("top_k must be >= 0 and max_new_tokens >= 1")


@dataclasses.dataclass(frozen=True)
class GenerateRequest:
    session: str
    input_ids: Sequence[int]  # the whole history; engines reuse what they already hold


@dataclasses.dataclass(frozen=True)
class Completion:
    token_ids: list[int]  # sampled, verbatim; includes the stop token when it stopped on one
    logprobs: list[float]  # one per sampled token
    finish_reason: FinishReason
    weight_version: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class WeightUpdate:
    """New policy weights in the two forms engines take, each made only when an engine asks.

    In-process engines read `model()` (the NNX `CausalLM` itself, not a copy); server clients read
    `hf_dir()` (an HF directory: safetensors, config.json, tokenizer) and have the server load it.
    Both are made on first call and cached, so an in-process engine never pays for an export and a
    server client never for a model in memory.

    Attributes:
      version: the weight version later samples are tagged with (the learner's step).
      load_model: makes the model; called at most once.
      publish: writes the HF directory (if it is not on disk already) and returns its path; called
        at most once.
    """

    version: int
    load_model: Callable[[], Any]
    publish: Callable[[], str | os.PathLike]
    _made: dict[str, Any] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def published(cls, version: int, hf_dir: str | os.PathLike, load_model: Callable[[], Any]) -> WeightUpdate:
        """Weights that are on disk already (a checkpoint to evaluate or serve)."""
        path = epath.Path(hf_dir)
        return cls(version=version, load_model=load_model, publish=lambda: path)

    def model(self) -> Any:
        if "model" not in self._made:
            self._made["model"] = self.load_model()
        return self._made["model"]

    def hf_dir(self) -> epath.Path:
        """Local or gs:// (a run directory on shared storage): the server must be able to read it."""
        if "hf_dir" not in self._made:
            self._made["hf_dir"] = epath.Path(self.publish())
        return self._made["hf_dir"]


class RolloutEngine(Protocol):
    """Attributes:
      weight_version: the version of the weights replies are sampled from.
      collective: whether `generate` runs programs over the devices of every JAX process (the
        embedded sampler on a global mesh), so all processes must call it together; False for a
        host-side client, which process 0 alone drives on several processes (`run_episodes`).
    """

    weight_version: int
    collective: bool

    def generate(self, requests: Sequence[GenerateRequest], params: SamplingParams) -> list[Completion]: ...

    def release(self, session: str) -> None: ...

    def update_weights(self, weights: WeightUpdate) -> None:
        """Samples from `weights` from now on, tagged `weights.version`; cached sessions are dropped."""
        ...

    def reseed(self, seed: int, step: int) -> None:
        """Restarts sampling at a stream keyed by (seed, step), so a batch of episodes depends only on
        its key and the weights and a resumed run replays it. A documented no-op where the sampling
        randomness is not the engine's own."""
        ...


class ScriptedEngine:
    """Replays text chosen by a function of the session (a policy, a test script) as tokens.

    Used for oracle demonstrations (SFT data through the exact agent-loop format) and as the second
    implementation the agent loop is tested against. Log-probs are 0 (the script is certain).
    """

    collective = False

    def __init__(self, encode: Callable[[str], list[int]], script: Callable[[str, Sequence[int]], str],
                 stop_token_id: int):
        self._encode, self._script, self._stop = encode, script, stop_token_id
        self.weight_version = 0
        self.released: list[str] = []

    def generate(self, requests: Sequence[GenerateRequest], params: SamplingParams) -> list[Completion]:
        """Like a sampler, it stops only at one of `params.stop_token_ids` (else at the length limit)."""
        out = []
        for r in requests:
            ids = self._encode(self._script(r.session, r.input_ids)) + [self._stop]
            end = next((k + 1 for k, t in enumerate(ids) if t in params.stop_token_ids), None)
            reason: FinishReason = "stop"
            if end is None or end > params.max_new_tokens:
                ids, reason = ids[: params.max_new_tokens], "length"
            else:
                ids = ids[:end]
            out.append(Completion(ids, [0.0] * len(ids), reason, self.weight_version))
        return out

    def release(self, session: str) -> None:
        self.released.append(session)

    def update_weights(self, weights: WeightUpdate) -> None:
        """Only tags later replies with the version: the script is the policy, it has no weights."""
        self.weight_version = weights.version

    def reseed(self, seed: int, step: int) -> None:
        """A no-op: the script draws no randomness of the engine's (a script keeps its own seeds)."""
