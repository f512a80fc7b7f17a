"""ModelConfig from HF config.json layouts, validation messages, presets."""

import json

import pytest

from intraskill_jax.models import ModelConfig, config_from_file, config_from_hf, get_family, hf_config

TEXT_4B = {
    "model_type": "qwen3_5_text",
    "attention_bias": False,
    "attn_output_gate": True,
    "eos_token_id": 248044,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 2560,
    "intermediate_size": 9216,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "mamba_ssm_dtype": "float32",
    "mlp_only_layers": [],
    "mtp_num_hidden_layers": 1,
    "num_attention_heads": 16,
    "num_hidden_layers": 32,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {
        "mrope_interleaved": True,
        "mrope_section": [11, 11, 10],
        "rope_type": "default",
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
    },
    "vocab_size": 248320,
}
VLM_4B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"],
    "model_type": "qwen3_5",
    "eos_token_id": 248046,
    "pad_token_id": 248044,
    "tie_word_embeddings": True,
    "text_config": TEXT_4B,
    "vision_config": {"model_type": "qwen3_5", "depth": 24},
}
QWEN3_4B = {
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rope_theta": 1000000,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "eos_token_id": 151645,
    "use_sliding_window": False,
}


def test_vlm_layout_reads_text_config_and_top_level_flags():
    cfg = config_from_hf(VLM_4B, dtype="float32", param_dtype="float32")
    preset = ModelConfig.qwen3_5_4b(dtype="float32", param_dtype="float32")
    assert cfg == preset
    assert cfg.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert cfg.rotary_dim == 64 and cfg.linear_conv_dim == 2 * 16 * 128 + 32 * 128
    assert cfg.eos_token_ids == (248046, 248044)


def test_text_only_layout_and_transformers_config_agree():
    from transformers import Qwen3_5TextConfig

    from_dict = config_from_hf(TEXT_4B)
    hf = Qwen3_5TextConfig(**{k: v for k, v in TEXT_4B.items() if k != "model_type"}).to_dict()
    assert config_from_hf(hf) == from_dict
    assert not from_dict.tie_word_embeddings  # text_config default when no wrapper says otherwise


def test_qwen3_layout_with_legacy_rope_theta(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_4B))
    cfg = config_from_file(tmp_path)
    assert cfg.family == "qwen3" and cfg.rope_theta == 1e6 and cfg.partial_rotary_factor == 1.0
    assert cfg.layer_types == ("full_attention",) * 36 and cfg.tie_word_embeddings
    architecture = get_family(cfg.family).architecture
    assert not architecture.zero_centered_norm and not architecture.attn_output_gate and architecture.qk_norm


def test_qwen3_4b_preset_is_the_checkpoints_architecture():
    # The preset adds what the checkpoint's config.json also carries: its context and pad/EOS ids.
    hf = {**QWEN3_4B, "max_position_embeddings": 40960, "pad_token_id": 151643, "eos_token_id": [151645, 151643]}
    assert ModelConfig.qwen3_4b(dtype="float32", param_dtype="float32") == config_from_hf(
        hf, dtype="float32", param_dtype="float32")


@pytest.mark.parametrize("make", [ModelConfig.tiny_qwen3_5, ModelConfig.tiny_qwen3, ModelConfig.tiny_llama])
def test_hf_dict_round_trip(make):
    cfg = make()
    assert (
        config_from_hf(hf_config(cfg), dtype=cfg.dtype, param_dtype=cfg.param_dtype)
        == cfg
    )


@pytest.mark.parametrize(
    "change,message",
    [
        ({"model_type": "qwen3_next"}, "Unsupported model_type"),
        ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
        (
            {"linear_num_value_heads": 20, "linear_num_key_heads": 16},
            "multiple of linear_num_key_heads",
        ),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope_type 'yarn'"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"layer_types": ["full_attention"]}, "one type per layer"),
    ],
)
def test_invalid_configs_name_the_problem(change, message):
    with pytest.raises(ValueError, match=message):
        config_from_hf({**TEXT_4B, **change})


def test_missing_field_and_bad_own_fields():
    broken = dict(TEXT_4B)
    del broken["linear_key_head_dim"]
    with pytest.raises(ValueError, match="linear_key_head_dim"):
        config_from_hf(broken)
    with pytest.raises(ValueError, match="remat"):
        ModelConfig.tiny_qwen3_5(remat="sometimes")
    with pytest.raises(ValueError, match="dtype"):
        ModelConfig.tiny_qwen3_5(dtype="float16")
    with pytest.raises(FileNotFoundError, match="config.json"):
        config_from_file("/nonexistent/checkpoint")


def test_dtype_default_follows_backend():
    cfg = ModelConfig(
        family="qwen3",
        vocab_size=8,
        hidden_size=8,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=8,
        layer_types=("full_attention",),
    )
    assert cfg.dtype == cfg.param_dtype == "float32"  # tests run on CPU


def test_configs_saved_by_transformers_parse():
    from transformers import Qwen3_5Config, Qwen3Config

    tiny = ModelConfig.tiny_qwen3_5()
    text = hf_config(tiny)
    text.pop("model_type"), text.pop("architectures")
    vlm = Qwen3_5Config(text_config=text, tie_word_embeddings=True).to_dict()
    assert config_from_hf(vlm) == tiny.replace(tie_word_embeddings=True)
    dense = ModelConfig.tiny_qwen3()
    hf = hf_config(dense)
    hf.pop("model_type"), hf.pop("architectures")
    assert config_from_hf(Qwen3Config(**hf).to_dict()) == dense
