"""LoRA adapters on the models' linear layers, built from flax.nnx's own `nnx.LoRA`.

An adapted `Linear` computes y = x Wᵀ (+ b) + s · (x A) B with W [out, in] frozen, A [in, r] and
B [r, out] trainable (`nnx.LoRAParam`, B initialised to zero so a fresh adapter changes nothing)
and s = alpha / r (Hu et al. 2021). The adapter is the layer's `lora` submodule, so every HF key
path of the base weights stays as it is and the adapters sit beside them
(`model.layers.0.self_attn.q_proj.lora.lora_a`).

What the rest of the trainer sees:
  * training: a model holding adapters trains them alone (`trainable`); the base weights are
    operands of the step, with no gradient and no optimizer moments (`rl/train_step.py`);
  * export: `merged` folds the adapters into W (W + s · (A B)ᵀ, HF layout), which is what
    `models.params.save_pretrained` writes, so transformers and SGLang load a plain checkpoint;
  * the KL reference: `without_adapters` is the same model with the adapters off, over the same
    base arrays (no second copy of the weights), and `base_params` its parameters.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import spmd

from intraskill_jax.models import sharding as sharding_lib
from intraskill_jax.models.layers import Linear

M = TypeVar("M", bound=nnx.Module)

# The attention and MLP projections of every family (HF attribute names).
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The LM head's weight is read as a matrix (chunked log-probs, tied logits), never called as a
# layer, so an adapter there would be silently ignored.
_NOT_ADAPTABLE = ("lm_head",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """Low-rank adapters for a fine-tuning stage (`train.lora`, `warm_start.sft.lora`).

    Attributes:
      enabled: train adapters on the frozen model instead of every weight.
      rank: r, the inner dimension of A [in, r] and B [r, out].
      alpha: the adapters' output is scaled by alpha / rank.
      targets: attribute names of the linear layers that get an adapter, in every layer that has
        them (default: attention q/k/v/o and MLP gate/up/down projections).
    """

    enabled: bool = False
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = DEFAULT_TARGETS

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"rank={self.rank}: must be >= 1; set rank to 1 or more (e.g. 8)")
        if not self.alpha > 0:
            raise ValueError(f"alpha={self.alpha}: must be > 0; the adapters' output is scaled by alpha / rank "
                             "(e.g. alpha = 2 x rank)")
        if not self.targets:
            raise ValueError("targets is empty: name at least one linear layer (e.g. 'q_proj')")
        if any(not isinstance(t, str) or not t.isidentifier() for t in self.targets):
            raise ValueError(f"targets={self.targets!r}: each must be the attribute name of a linear layer "
                             "(e.g. 'up_proj', not 'mlp.up_proj')")
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"targets={self.targets!r} names a layer twice; list each once")
        bad = sorted(set(self.targets) & set(_NOT_ADAPTABLE))
        if bad:
            raise ValueError(f"targets names {bad}: the LM head's weight is read as a matrix, not called, so an "
                             "adapter there would be ignored; drop it from targets")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


def _axes_metadata(axes: tuple[str | None, ...]) -> dict[str, Any]:
    """Logical axes for an adapter matrix, placed eagerly exactly when `layers.param` would."""
    eager = (nnx.using_eager_sharding() and bool(spmd.get_logical_axis_rules())
             and not jax.sharding.get_abstract_mesh().empty)
    return {"out_sharding": axes, "eager_sharding": eager}


def _linears(model: nnx.Module) -> Iterator[tuple[tuple[Any, ...], Linear]]:
    for path, module in nnx.iter_modules(model):
        if isinstance(module, Linear):
            yield path, module


def linear_names(model: nnx.Module) -> list[str]:
    """The attribute names of `model`'s linear layers (what `LoRAConfig.targets` may name); works on
    an abstract model (`nnx.eval_shape`) too."""
    return sorted({str(path[-1]) for path, _ in _linears(model)})


def check_targets(config: LoRAConfig, model: nnx.Module) -> None:
    """Raises ValueError naming the targets that no linear layer of `model` has, and the ones it has."""
    names = linear_names(model)
    missing = [t for t in config.targets if t not in names]
    if missing:
        raise ValueError(f"targets names {missing}, which no linear layer of this {type(model).__name__} has; its "
                         f"linear layers are {names}")


def apply_lora(model: M, config: LoRAConfig, *, seed: int = 0,
               mesh: jax.sharding.Mesh | None = None,
               rules: sharding_lib.LogicalRules = sharding_lib.DEFAULT_RULES) -> M:
    """Adds an adapter to every linear layer named in `config.targets`, in place; returns `model`.

    A is drawn He-uniform from `seed`, B is zero: the adapted model computes exactly what it did.
    Adapters are float32 whatever the base's storage dtype (Adam on bfloat16 adapters would lose
    the small updates) and computed in the layer's compute dtype. On a mesh they are laid out like
    their layer (A's rows like W's columns, B's columns like W's rows).
    """
    check_targets(config, model)
    linears = list(_linears(model))
    rngs = nnx.Rngs(params=seed)
    for path, linear in linears:
        if path[-1] not in config.targets:
            continue
        if linear.lora is not None:
            raise ValueError(f"{'.'.join(map(str, path))} already has a LoRA adapter; apply_lora once per model")
        out_features, in_features = linear.weight.shape
        out_axis, in_axis = sharding_lib.logical_axes(linear.weight) or (None, None)
        linear.lora = nnx.data(nnx.LoRA(
            in_features, config.rank, out_features, dtype=linear.dtype, param_dtype=jnp.float32, rngs=rngs,
            a_metadata=_axes_metadata((in_axis, None)), b_metadata=_axes_metadata((None, out_axis))))
        linear.lora_scale = config.scale
    if mesh is not None:
        sharding_lib.shard_model(model, mesh, rules)
    return model


def has_adapters(tree: nnx.Module | nnx.State) -> bool:
    """Whether a model (or an NNX state) holds LoRA parameters."""
    state = nnx.state(tree) if isinstance(tree, nnx.Module) else tree
    return bool(jax.tree.leaves(nnx.filter_state(state, nnx.LoRAParam)))


def trainable(params: nnx.State) -> type[nnx.Param]:
    """The filter of what an update trains: the adapters when there are any, else every parameter."""
    return nnx.LoRAParam if has_adapters(params) else nnx.Param


def base_params(params: nnx.State) -> nnx.State:
    """The base weights of a (possibly adapted) model's parameters: the adapters left out."""
    return nnx.filter_state(params, nnx.Not(nnx.LoRAParam))


@functools.partial(jax.jit, static_argnames=("scale",))
def merge_weight(weight: jax.Array, lora_a: jax.Array, lora_b: jax.Array, *, scale: float) -> jax.Array:
    """W + scale · (A B)ᵀ in W's [out, in] layout and dtype; A [in, r], B [r, out].

    The product is taken in float32, as the adapters are stored, and rounded once.
    """
    delta = jnp.einsum("ir,ro->oi", lora_a.astype(jnp.float32), lora_b.astype(jnp.float32))
    return (weight.astype(jnp.float32) + scale * delta).astype(weight.dtype)


def _copy(model: M) -> M:
    """New modules over the same Variables: changing an attribute of the copy leaves `model` as it
    is, but a Variable must be replaced (not set) to leave it so."""
    return nnx.merge(*nnx.split(model))


@functools.partial(jax.jit, static_argnames=("scales",))
def _merge_weights(weights: tuple[jax.Array, ...], lora_a: tuple[jax.Array, ...], lora_b: tuple[jax.Array, ...], *,
                   scales: tuple[float, ...]) -> tuple[jax.Array, ...]:
    # One program for every layer: a push pays one dispatch, not one per adapted layer.
    return tuple(merge_weight(w, a, b, scale=s) for w, a, b, s in zip(weights, lora_a, lora_b, scales))


def merged(model: M) -> M:
    """`model` with every adapter folded into its layer's weight: a plain model (no adapters) that
    computes what the adapted one does, sharing the arrays of the layers without one. `model` is
    left as it is; a model without adapters is returned itself."""
    if not has_adapters(model):
        return model
    out = _copy(model)
    adapted = [linear for _, linear in _linears(out) if linear.lora is not None]
    weights = _merge_weights(tuple(x.weight[...] for x in adapted), tuple(x.lora.lora_a[...] for x in adapted),
                             tuple(x.lora.lora_b[...] for x in adapted), scales=tuple(x.lora_scale for x in adapted))
    for linear, w in zip(adapted, weights):
        linear.weight = linear.weight.replace(w)
        linear.lora, linear.lora_scale = None, 0.0
    return out


def without_adapters(model: M) -> M:
    """`model` with its adapters off: the base model over the same arrays (nothing is copied).
    `model` keeps its adapters."""
    out = _copy(model)
    for _, linear in _linears(out):
        linear.lora, linear.lora_scale = None, 0.0
    return out
