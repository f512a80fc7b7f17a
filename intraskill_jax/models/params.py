"""HuggingFace safetensors in and out of sharded NNX state, for every registered family.

The checkpoint's config.json names the family (`models/families.py`); the family's `KeyMap`
(`models/<family>/params.py`) maps each checkpoint key onto a parameter path or skips it, and
anything neither mapped nor skipped is an error. A config.json with a `text_config` is a
multimodal wrapper's layout (the family's `KeyMap.wrapped_prefix`).

Loading never holds a full host copy per device: each file is memory-mapped and
`jax.make_array_from_callback` asks for exactly the slice each device owns. The header is parsed
here rather than through `safetensors.safe_open(framework="numpy")` because NumPy has no bfloat16;
`ml_dtypes` provides it, and the same parse validates offsets so truncated files fail clearly.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import struct
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from intraskill_jax.errors import CheckpointError
from intraskill_jax.models import families
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models import sharding as sharding_lib
from intraskill_jax.models.config import ModelConfig, read_hf_config
from intraskill_jax.models.decoder import CausalLM
from intraskill_jax.models.family import Family, KeyMap

logger = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
_CONFIG_DTYPE_NAMES = {
    np.dtype(ml_dtypes.bfloat16): "bfloat16",
    np.dtype(np.float32): "float32",
    np.dtype(np.float16): "float16",
}


@dataclasses.dataclass(frozen=True)
class TensorRecord:
    """Where one tensor lives: file, dtype, shape and absolute byte offsets."""

    file: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    end: int

    def view(self) -> np.ndarray:
        """A read-only memory-mapped view; slicing it reads only the touched bytes."""
        if self.end == self.start:
            return np.zeros(self.shape, self.dtype)
        buffer = np.memmap(self.file, dtype=np.uint8, mode="r")
        return np.ndarray(self.shape, self.dtype, buffer=buffer, offset=self.start)


def read_header(file: Path) -> dict[str, TensorRecord]:
    """Parse and validate one safetensors header (offsets against the file's real size)."""
    size = file.stat().st_size
    with file.open("rb") as f:
        raw_len = f.read(8)
        if len(raw_len) < 8:
            raise CheckpointError(f"{file}: too short ({size} bytes) to be a safetensors file.")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > size - 8:
            raise CheckpointError(
                f"{file}: header claims {header_len} bytes but the file has {size}; truncated or "
                "not a safetensors file. Re-download or re-export it."
            )
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{file}: corrupt safetensors header ({e}).") from e
    header.pop("__metadata__", None)
    data_start = 8 + header_len
    records = {}
    for key, entry in header.items():
        try:
            dtype = _DTYPES[entry["dtype"]]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{file}: bad header entry for {key!r}: {entry!r}.") from e
        if end - begin != int(np.prod(shape)) * dtype.itemsize or begin > end:
            raise CheckpointError(f"{file}: {key!r} offsets {begin}..{end} do not fit {shape}.")
        if data_start + end > size:
            raise CheckpointError(
                f"{file}: {key!r} ends at byte {data_start + end} but the file has {size}; the "
                "file is truncated. Re-download or re-export it."
            )
        records[key] = TensorRecord(file, dtype, shape, data_start + begin, data_start + end)
    return records


def read_checkpoint(directory: str | Path) -> dict[str, TensorRecord]:
    """Every tensor of a HF checkpoint directory: one `model.safetensors` or an index + shards."""
    directory = Path(directory)
    index_path = directory / INDEX_FILE
    if index_path.exists():
        try:
            weight_map: dict[str, str] = json.loads(index_path.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index_path}: not a valid safetensors index ({e}).") from e
        files = sorted(set(weight_map.values()))
    elif (directory / SINGLE_FILE).exists():
        weight_map, files = {}, [SINGLE_FILE]
    else:
        raise CheckpointError(
            f"{directory}: neither {SINGLE_FILE} nor {INDEX_FILE} found; point at a HF checkpoint "
            "directory saved with safetensors."
        )
    records: dict[str, TensorRecord] = {}
    for name in files:
        if not (directory / name).exists():
            raise CheckpointError(f"{index_path}: lists {name}, which is missing from {directory}.")
        records.update(read_header(directory / name))
    listed_nowhere = sorted(k for k, f in weight_map.items() if k not in records)
    if listed_nowhere:
        raise CheckpointError(
            f"{index_path}: keys listed but absent from their files: {listed_nowhere}."
        )
    return records


def checkpoint_family(directory: str | Path) -> Family:
    """The model family of the HF checkpoint in `directory`, from its config.json."""
    hf_config = read_hf_config(directory)
    try:
        return families.family_for_hf(hf_config)
    except ValueError as e:
        raise CheckpointError(f"{directory}/config.json: {e}") from None


def is_multimodal(hf_config: Mapping[str, Any]) -> bool:
    return "text_config" in hf_config


def _text_config(hf_config: Mapping[str, Any]) -> Mapping[str, Any]:
    return hf_config.get("text_config", hf_config)


def _tied(hf_config: Mapping[str, Any]) -> bool:
    return bool(
        _text_config(hf_config).get(
            "tie_word_embeddings", hf_config.get("tie_word_embeddings", False)
        )
    )


def _path_key(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def _map_records(
    records: Mapping[str, TensorRecord],
    wanted: Mapping[str, Any],
    tied: bool,
    keys: KeyMap,
    where: Path,
) -> dict[str, TensorRecord]:
    """Match checkpoint keys to model keys; raise on anything missing, unexpected or misshapen."""
    mapped: dict[str, TensorRecord] = {}
    skipped: list[str] = []
    unexpected: list[str] = []
    for hf_key, record in records.items():
        key = keys.to_model_key(hf_key)
        if key is None or (tied and key == "lm_head.weight" and key not in wanted):
            skipped.append(hf_key)
        elif key in wanted:
            mapped[key] = record
        else:
            unexpected.append(hf_key)
    missing = sorted(set(wanted) - set(mapped))
    if missing or unexpected:
        raise CheckpointError(
            f"{where}: checkpoint does not match the model. Missing: {missing}. Unexpected (neither "
            f"a parameter nor a skip pattern): {sorted(unexpected)}."
        )
    for key, record in mapped.items():
        if record.shape != tuple(wanted[key].shape):
            raise CheckpointError(
                f"{record.file}: {key} has shape {record.shape}, the model expects "
                f"{tuple(wanted[key].shape)}; config.json and weights disagree."
            )
    if skipped:
        logger.info(
            "Skipped %d checkpoint tensors not used by the text model (%s, ...).",
            len(skipped),
            skipped[0],
        )
    return mapped


def _load_array(record: TensorRecord, target: jax.ShapeDtypeStruct, sharding: Any) -> jax.Array:
    view = record.view()
    dtype = np.dtype(target.dtype)

    def shard(index: tuple[slice, ...]) -> np.ndarray:
        return np.asarray(view[index], dtype=dtype)

    if sharding is None:
        # Uncommitted, on the default device. Committed single-device parameters made every jit
        # dispatch ~150 ms slower on CPU (jax 0.10: a 4 ms decode step took 160 ms).
        return jnp.array(shard(tuple(slice(None) for _ in target.shape)))
    return jax.make_array_from_callback(target.shape, sharding, shard)


def load_state(
    directory: str | Path,
    factory: Callable[[], nnx.Module],
    *,
    mesh: jax.sharding.Mesh | None = None,
    rules: sharding_lib.LogicalRules = sharding_lib.DEFAULT_RULES,
) -> nnx.Module:
    """Build the model `factory()` describes with its parameters read from a HF checkpoint.

    The model is only traced (`nnx.eval_shape`); parameters go straight from the memory-mapped
    files to their devices, in the dtype the model declares. Variables that are not parameters
    (e.g. precomputed tables) are computed by a jit that XLA prunes to just them.
    """
    directory = Path(directory)
    hf_config = read_hf_config(directory)
    records = read_checkpoint(directory)
    graphdef, abstract = sharding_lib.abstract_model(factory, mesh, rules)
    params, _ = nnx.split_state(abstract, nnx.Param, ...)
    flat = {_path_key(path): var for path, var in nnx.to_flat_state(params)}
    keys = families.family_for_hf(hf_config).keys
    mapped = _map_records(
        records, {k: v.get_value() for k, v in flat.items()}, _tied(hf_config), keys, directory
    )
    loaded = [
        (path, var.replace(_load_array(mapped[_path_key(path)], var.get_value(), var.get_value().sharding)))
        for path, var in nnx.to_flat_state(params)
    ]
    params = nnx.from_flat_state(loaded)

    @jax.jit
    def others() -> Any:
        with nnx.use_eager_sharding(False):
            return nnx.split(factory(), nnx.Param, ...)[2]

    return nnx.merge(graphdef, params, others())


def _iter_export(
    model: nnx.Module, keys: KeyMap, multimodal: bool, dtype: Any | None
) -> Iterator[tuple[str, jax.Array]]:
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = var.get_value()
        yield keys.to_hf_key(_path_key(path), multimodal), value.astype(dtype) if dtype else value


def _host(value: jax.Array | np.ndarray) -> np.ndarray:
    # On several processes the caller gathers sharded parameters first (rundir.publish_policy).
    return np.ascontiguousarray(jax.device_get(value))


def save_pretrained(
    model: nnx.Module,
    directory: str | Path,
    *,
    hf_config: Mapping[str, Any] | None = None,
    max_shard_size: int = 4 << 30,
    dtype: Any | None = None,
    source: str | Path | None = None,
) -> Path:
    """Write `model` as a HF checkpoint (`config.json`, safetensors shards and their index).

    Args:
      model: an NNX model whose parameter paths are HF text-model keys; LoRA adapters, if it has
        any, are merged into their layers' weights (a plain checkpoint, as transformers and SGLang
        load it).
      directory: output directory, created if needed.
      hf_config: the HF `config.json` dict (default: `families.hf_config(model.config)`, text-only);
        a `text_config` entry selects the multimodal layout (`model.language_model.*`).
      max_shard_size: bytes per safetensors file; at most one shard's tensors are on the host.
      dtype: cast parameters to this dtype before writing (default: as stored).
      source: the checkpoint this model came from; tensors the model skipped (vision tower, MTP)
        are copied from it unchanged, so SGLang or transformers get a complete checkpoint.
    """
    directory = Path(directory)
    model = lora_lib.merged(model)
    hf_config = families.hf_config(model.config) if hf_config is None else hf_config
    family = families.get_family(model.config.family)
    multimodal = is_multimodal(hf_config)
    if multimodal and family.keys.wrapped_prefix is None:
        raise ValueError(
            f"hf_config has a text_config (a multimodal layout), but family {family.name!r} has "
            "no multimodal wrapper; save with its own config (hf_config=None)."
        )
    directory.mkdir(parents=True, exist_ok=True)
    entries: list[tuple[str, Callable[[], np.ndarray], int]] = []
    bytes_by_dtype: dict[np.dtype, int] = {}
    for key, value in _iter_export(model, family.keys, multimodal, dtype):
        nbytes = value.size * np.dtype(value.dtype).itemsize
        bytes_by_dtype[np.dtype(value.dtype)] = (
            bytes_by_dtype.get(np.dtype(value.dtype), 0) + nbytes
        )
        entries.append((key, lambda v=value: _host(v), nbytes))
    if source is not None:
        for key, record in read_checkpoint(source).items():
            if family.keys.to_model_key(key) is None:
                entries.append((key, record.view, record.end - record.start))

    shards: list[list[tuple[str, Callable[[], np.ndarray]]]] = [[]]
    size = 0
    for key, fetch, nbytes in entries:
        if shards[-1] and size + nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append((key, fetch))
        size += nbytes
    names = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    weight_map = {}
    for name, shard in zip(names, shards):
        save_file(
            {key: fetch() for key, fetch in shard}, directory / name, metadata={"format": "pt"}
        )
        weight_map.update({key: name for key, _ in shard})
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(n for _, _, n in entries)},
            "weight_map": weight_map,
        }
        (directory / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True))
    else:
        (directory / INDEX_FILE).unlink(missing_ok=True)
    config = json.loads(json.dumps(hf_config))
    # transformers loads in the dtype config.json names; name the one most bytes were saved in.
    saved = (
        _CONFIG_DTYPE_NAMES.get(max(bytes_by_dtype, key=bytes_by_dtype.get))
        if bytes_by_dtype
        else None
    )
    for part in (config, config.get("text_config")):
        if saved and isinstance(part, dict):
            part["dtype"] = saved
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return directory


def load_pretrained(
    path: str | Path,
    *,
    mesh: jax.sharding.Mesh | None = None,
    dtype: str | Any | None = None,
    param_dtype: str | Any | None = None,
    rules: sharding_lib.LogicalRules = sharding_lib.DEFAULT_RULES,
    **config_overrides: Any,
) -> CausalLM:
    """Load a HF checkpoint directory of a registered family (Qwen3.5 multimodal or text-only,
    Qwen3).

    Args:
      path: directory with `config.json` and `model.safetensors` (or an index and its shards).
      mesh: place parameters on this mesh following `rules`; None keeps them on one device.
      dtype: compute dtype ('float32' / 'bfloat16'); default: float32 on CPU, bfloat16 elsewhere.
      param_dtype: storage dtype; defaults to `dtype`.
      config_overrides: other `ModelConfig` fields (e.g. remat='full').

    Returns:
      The model; `model(input_ids, attention_mask=...)` gives logits [B, T, V].
    """
    overrides = dict(config_overrides)
    if dtype is not None:
        overrides["dtype"] = np.dtype(dtype).name
        overrides.setdefault("param_dtype", overrides["dtype"])
    if param_dtype is not None:
        overrides["param_dtype"] = np.dtype(param_dtype).name
    config = families.config_from_hf(read_hf_config(path), **overrides)
    cls = families.get_family(config.family).model_class
    return load_state(path, lambda: cls(config, rngs=nnx.Rngs(0)), mesh=mesh, rules=rules)
