"""Tiny HF PyTorch reference models and a weight copy into our NNX models (test helper only;
`models/params.py` is the real loader)."""

from __future__ import annotations

import numpy as np
import torch
from flax import nnx

from intraskill_jax.models import ModelConfig, causal_lm_class, hf_config


def build_hf_model(config: ModelConfig, seed: int = 0) -> torch.nn.Module:
    """HF `Qwen3_5ForCausalLM` / `Qwen3ForCausalLM` / `LlamaForCausalLM` for `config`, fp32, eager
    attention, with every norm weight, A_log, dt_bias and bias randomised (default inits hide
    (1+w) vs w mistakes)."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen3_5ForCausalLM,
        Qwen3_5TextConfig,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    torch.manual_seed(seed)
    hf = hf_config(config)
    hf.pop("model_type"), hf.pop("architectures")
    classes = {"qwen3_5": (Qwen3_5ForCausalLM, Qwen3_5TextConfig), "qwen3": (Qwen3ForCausalLM, Qwen3Config),
               "llama": (LlamaForCausalLM, LlamaConfig)}
    model_class, config_class = classes[config.family]
    model = model_class(config_class(**hf, attn_implementation="eager"))
    model = model.float().eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                plain = config.family != "qwen3_5" or name.endswith("linear_attn.norm.weight")
                centre = 1.0 if plain else 0.0
                p.copy_(centre + torch.rand(p.shape, generator=gen) - 0.5)
            elif name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=gen) * 2.0 - 1.0)
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):  # zero-initialised by HF, which would hide a dropped bias
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def copy_into(torch_model: torch.nn.Module, model: nnx.Module) -> None:
    """Copy every torch parameter into the NNX parameter at the same '.'-joined path."""
    torch_state = {k: v.detach().numpy() for k, v in torch_model.state_dict().items()}
    ours = nnx.state(model, nnx.Param)
    seen = set()
    for path, var in nnx.to_flat_state(ours):
        key = ".".join(str(p) for p in path)
        assert key in torch_state, f"{key} has no HF counterpart"
        value = torch_state[key]
        assert value.shape == var.get_value().shape, (key, value.shape, var.get_value().shape)
        var.set_value(np.asarray(value, dtype=var.get_value().dtype))
        seen.add(key)
    missing = set(torch_state) - seen
    if model.config.tie_word_embeddings:
        missing.discard("lm_head.weight")
    assert not missing, f"HF parameters not in our model: {sorted(missing)}"
    nnx.update(model, ours)


def paired_models(config: ModelConfig, seed: int = 0):
    """(torch reference, our model with the same weights)."""
    ref = build_hf_model(config, seed)
    ours = causal_lm_class(config)(config, rngs=nnx.Rngs(seed))
    copy_into(ref, ours)
    return ref, ours


def hf_logits(ref: torch.nn.Module, ids: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Reference logits with HF-generate-style positions (real tokens counted from 0)."""
    kwargs = {}
    if mask is not None:
        kwargs["attention_mask"] = torch.tensor(mask, dtype=torch.long)
        kwargs["position_ids"] = torch.tensor(
            np.maximum(np.cumsum(mask, 1) - 1, 0), dtype=torch.long
        )
    with torch.no_grad():
        return ref(input_ids=torch.tensor(ids, dtype=torch.long), **kwargs).logits.numpy()


def rel_err(a, b, mask=None) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if mask is not None:
        a, b = a[mask.astype(bool)], b[mask.astype(bool)]
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def left_padded(rng: np.random.Generator, batch: int, length: int, vocab: int, pads: list[int]):
    """ids [B, T] and mask [B, T] with `pads[b]` pad tokens on the left of row b.

    Pad positions hold random ids, so a leak of padding into real positions shows up."""
    ids = rng.integers(0, vocab, size=(batch, length))
    mask = np.ones((batch, length), np.int32)
    for b, p in enumerate(pads):
        mask[b, :p] = 0
    return ids, mask
