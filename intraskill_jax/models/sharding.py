"""Device mesh, logical-axis rules and helpers that place NNX models on a mesh.

Parameters carry logical axis names ('vocab', 'embed', 'mlp', ...) as metadata; the rules below
map them to the mesh axes ('data', 'fsdp', 'tensor'). A mesh axis that does not divide a
dimension is dropped for that array (it is replicated along it instead), so tiny test models and
odd head counts shard as far as they can rather than fail.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import jax
import numpy as np
from flax import nnx
from flax.core import spmd as flax_spmd
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

LogicalRules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

DEFAULT_RULES: LogicalRules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("seq", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("q_heads_dim", "tensor"),
    ("kv_heads_dim", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("linear_qkv", "tensor"),
    ("linear_z", "tensor"),
    ("linear_heads", "tensor"),
    ("conv_kernel", None),
    ("norm", None),
)

# Metadata keys a Variable may use for its logical axes; flax's own key is 'out_sharding'.
_AXES_METADATA_KEYS = ("logical_axes", "out_sharding", "sharding_names", "sharding")

M = TypeVar("M", bound=nnx.Module)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig:
    """Mesh shape over ('data', 'fsdp', 'tensor'); exactly one axis may be -1 ("the rest")."""

    data: int = 1
    fsdp: int = -1
    tensor: int = 1

    def resolve(self, num_devices: int) -> tuple[int, int, int]:
        sizes = (self.data, self.fsdp, self.tensor)
        if any(s == 0 or s < -1 for s in sizes) or sizes.count(-1) > 1:
            raise ValueError(f"MeshConfig {self}: sizes must be positive, with at most one -1.")
        known = math.prod(s for s in sizes if s != -1)
        if num_devices % known:
            raise ValueError(f"MeshConfig {self} does not divide {num_devices} devices.")
        resolved = tuple(num_devices // known if s == -1 else s for s in sizes)
        if math.prod(resolved) != num_devices:
            raise ValueError(
                f"MeshConfig {self} covers {math.prod(resolved)} devices but {num_devices} are "
                "available; set one axis to -1 to absorb the rest."
            )
        return resolved  # type: ignore[return-value]


def make_mesh(config: MeshConfig = MeshConfig(), devices: Sequence[Any] | None = None) -> Mesh:
    """A mesh with axes ('data', 'fsdp', 'tensor'); Auto axes so XLA propagates shardings."""
    devices = list(devices if devices is not None else jax.devices())
    shape = config.resolve(len(devices))
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    try:
        return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices)
    except NotImplementedError:
        # jax.make_mesh splits a physical axis of the chip grid only on v5e; fsdp=32 x tensor=2 on
        # v6e-64's 8x8 chips needs one (each tensor pair then shares a row of the torus).
        grid = mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
        return Mesh(grid, MESH_AXES, axis_types=auto)


def logical_axes(variable: nnx.Variable) -> tuple[str | None, ...] | None:
    """The logical axis names recorded on a Variable, or None when it has none."""
    metadata = variable.get_metadata()
    for key in _AXES_METADATA_KEYS:
        axes = metadata.get(key)
        if axes:
            return tuple(axes)
    return None


def logical_to_spec(
    axes: Sequence[str | None] | None,
    shape: Sequence[int],
    mesh: Mesh | jax.sharding.AbstractMesh,
    rules: LogicalRules = DEFAULT_RULES,
) -> PartitionSpec:
    """Resolve logical axis names to a PartitionSpec that fits `shape` on `mesh`.

    A mesh axis is used at most once per array (the first dimension asking for it wins), and
    only when the product of the mesh axes kept for a dimension divides it; size-1 axes are
    left out so specs read as what is really split.
    """
    if axes is None:
        return PartitionSpec()
    if len(axes) != len(shape):
        raise ValueError(f"Logical axes {tuple(axes)} do not match shape {tuple(shape)}.")
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for name, dim in zip(axes, shape):
        if name is not None and name not in table and name not in mesh.shape:
            raise KeyError(f"No sharding rule for logical axis {name!r}; known: {sorted(table)}.")
        target = table.get(name, name) if name is not None else None
        targets = (target,) if isinstance(target, str) else tuple(target or ())
        kept: list[str] = []
        for axis in targets:
            if axis in used or mesh.shape.get(axis, 1) == 1:
                continue
            if dim % (math.prod(mesh.shape[a] for a in kept) * mesh.shape[axis]) == 0:
                kept.append(axis)
        used.update(kept)
        spec.append(kept[0] if len(kept) == 1 else (tuple(kept) or None))
    return PartitionSpec(*spec)


def state_shardings(state: Any, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> Any:
    """NamedSharding for every Variable of an (abstract or concrete) NNX state, same tree."""

    def one(leaf: Any) -> Any:
        if isinstance(leaf, nnx.Variable):
            spec = logical_to_spec(logical_axes(leaf), np.shape(leaf.get_value()), mesh, rules)
            return leaf.replace(NamedSharding(mesh, spec))
        return NamedSharding(mesh, PartitionSpec())

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def abstract_model(
    factory: Callable[[], M], mesh: Mesh | None = None, rules: LogicalRules = DEFAULT_RULES
) -> tuple[nnx.GraphDef, Any]:
    """(graphdef, state of ShapeDtypeStructs) without allocating; sharded when a mesh is given."""
    # Eager sharding would try to place logical names as if they were mesh axes.
    with nnx.use_eager_sharding(False):
        graphdef, state = nnx.split(nnx.eval_shape(factory))
    if mesh is None:
        return graphdef, state
    shardings = state_shardings(state, mesh, rules)
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings
    )
    return graphdef, abstract


def create_sharded(factory: Callable[[], M], mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> M:
    """Build `factory()` directly in its sharded layout: each device only materialises its shard."""
    graphdef, abstract = abstract_model(factory, mesh, rules)
    shardings = jax.tree.map(lambda a: a.sharding, abstract)

    @functools.partial(jax.jit, out_shardings=shardings)
    def init() -> Any:
        return nnx.split(factory())[1]

    with nnx.use_eager_sharding(False):
        state = init()
    return nnx.merge(graphdef, state)


def shard_model(model: M, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> M:
    """Move an existing model's parameters onto `mesh` following the rules (in place)."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, state_shardings(state, mesh, rules)))
    return model


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding for (batch, ...) inputs: batch over data x fsdp, the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *([None] * (ndim - 1))))


def single_device() -> bool:
    """Whether the program being traced runs on one device (no mesh context, or a mesh of one).

    Layout choices made for XLA:CPU's single-device speed (`layers.Linear`,
    `layers.blocked_causal_attention`) apply only there: on a mesh they would let the partitioner
    split contracted axes across devices, and a run over several processes would no longer sum in
    the order one process does (tests/test_distributed.py compares their exports byte for byte).
    """
    mesh = jax.sharding.get_abstract_mesh()
    return mesh.empty or all(n == 1 for n in mesh.shape.values())


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """Sharding constraint on an activation by logical axes; a no-op outside a mesh context.

    Uses the rules of an enclosing `nnx.logical_axis_rules(...)` context, else DEFAULT_RULES.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    rules = flax_spmd.get_logical_axis_rules() or DEFAULT_RULES
    return jax.lax.with_sharding_constraint(x, logical_to_spec(axes, x.shape, mesh, rules))
