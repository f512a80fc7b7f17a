"""The model benchmark runs end to end on a micro config and reports what it timed (the figures
themselves come from the bench command on a quiet machine)."""

import jax
import pytest
from flax import nnx

from intraskill_jax.bench import model as bench
from intraskill_jax.models import ModelConfig, Qwen3_5ForCausalLM
from intraskill_jax.rollout.jax_sampler import for_sampling


def test_every_task_is_timed_on_both_sides(monkeypatch: pytest.MonkeyPatch):
    shape = bench.BenchShape(batch=2, seq=32, decode_batch=2, prompt=8, new_tokens=4, history=12, cache_slots=64)
    micro = lambda: ModelConfig.tiny_qwen3_5(  # noqa: E731
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        layer_types=("linear_attention", "full_attention"), num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, tie_word_embeddings=True)
    monkeypatch.setitem(bench.SIZES, "micro", (micro, shape))
    result = bench.run("micro", kernels=("cpu",), rounds=2)
    work = {"train": 2 * 32, "prefill": 2 * 8, "decode": 2 * 4, "generate": 2 * 4, "turn": 2 * 8}
    for task, tokens in work.items():
        for side in ("cpu", "transformers"):
            rounds = result[f"{task}_seconds_all_{side}"]
            assert len(rounds) == 2 and all(r > 0 for r in rounds)
            # each side's best round sets its figure (rounds are listed to 0.1 ms)
            assert tokens / result[f"{task}_tokens_per_s_{side}"] == pytest.approx(min(rounds), abs=1e-4)
            assert result[f"{task}_cpu_seconds_{side}"] > 0
        assert result[f"{task}_speedup_cpu"] == pytest.approx(
            result[f"{task}_tokens_per_s_cpu"] / result[f"{task}_tokens_per_s_transformers"])
    assert len(result["config"]["load_average_before"]) == 3
    # The step's FLOPs: a matmul forward and backward is 6 FLOPs per weight per token (the tied
    # head included); attention and elementwise work add some, not multiples.
    params = sum(x.size for x in jax.tree.leaves(nnx.state(Qwen3_5ForCausalLM(micro(), rngs=nnx.Rngs(0)))))
    assert 0.9 * 6 * params * 64 < result["train_gflop_per_step_cpu"] * 1e9 < 3 * 6 * params * 64
    assert result["matmul_peak_gflops"] > 0
    at_peak = result["train_gflop_per_step_cpu"] / result["matmul_peak_gflops"]
    assert result["train_speedup_bound_cpu"] == pytest.approx(64 / result["train_tokens_per_s_transformers"] / at_peak)
    # A decode step: 2 FLOPs per weight per row (the tied table is the head), plus its attention.
    assert 0.9 * 2 * params * 2 < result["decode_mflop_per_step_cpu"] * 1e6 < 3 * 2 * params * 2
    assert result["decode_weight_mib"] * 2**20 == 4 * params  # float32, the tied table read once as the head
    floor = max(result["decode_mflop_per_step_cpu"] / 1e3 / result["matmul_peak_gflops"],
                result["decode_weight_mib"] * 2**20 / 1e9 / result["weights_read_gbps"])
    reference_step = 2 / result["decode_tokens_per_s_transformers"]
    assert result["decode_speedup_bound_cpu"] == pytest.approx(reference_step / floor)
    assert result["decode_products_us_per_step_cpu"] > 0


def test_decode_weight_bytes_leave_out_an_untied_input_table():
    """A decode step reads the batch's rows of an untied input embedding, all of every other weight."""
    for tied in (True, False):
        config = ModelConfig.tiny_qwen3_5(vocab_size=96, hidden_size=32, tie_word_embeddings=tied)
        model = Qwen3_5ForCausalLM(config, rngs=nnx.Rngs(0))
        every = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        table = model.model.embed_tokens.weight[...].nbytes
        assert bench._decode_weight_bytes(config) == (every if tied else every - table)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("transposed", [True, False])
def test_decode_products_run_every_weight_product_of_a_step_once(tied: bool, transposed: bool):
    """The decode products' chain multiplies each row by every matrix a step reads once: 2 FLOPs per
    entry per row, whichever layout the sampler reads (every 2-D parameter; an untied input table
    is read by row, not multiplied)."""
    config = ModelConfig.tiny_qwen3_5(vocab_size=96, hidden_size=32, tie_word_embeddings=tied,
                                      transpose_decode_weights=transposed)
    model = Qwen3_5ForCausalLM(config, rngs=nnx.Rngs(0))
    matrices = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)) if x.ndim == 2)
    if not tied:
        matrices -= model.model.embed_tokens.weight[...].size
    chain, args = bench._decode_products(for_sampling(model), rows=3, passes=4)
    assert bench._flops(chain.lower(*args)) == pytest.approx(2 * 3 * matrices, rel=1e-3)  # one pass counted
    assert chain(*args).shape == (3, 32)
