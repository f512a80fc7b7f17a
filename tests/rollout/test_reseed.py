"""A reseeded sampler replays its episodes: sampling depends on the seed, not on earlier calls."""

from intraskill_jax.rollout.base import GenerateRequest, SamplingParams
from intraskill_jax.rollout.jax_sampler import JaxSampler, SamplerConfig
from tests.rollout.tiny_models import make_model


def test_reseed_replays_and_distinct_seeds_differ():
    sampler = JaxSampler(make_model("qwen3_5"), SamplerConfig(max_batch=2, max_length=256, prefill_buckets=(16,),
                                                              decode_buckets=(16,)))
    params = SamplingParams(temperature=1.0, max_new_tokens=16)
    prompts = [GenerateRequest("a", [5, 6, 7]), GenerateRequest("b", [9, 3])]

    def play(*seed):
        sampler.reseed(*seed)
        return [c.token_ids for c in sampler.generate(prompts, params)]

    first = play(0, 7)
    sampler.release("a")
    sampler.release("b")
    sampler.generate([GenerateRequest("c", [1, 2])], params)  # advances the stream, reorders free rows
    assert play(0, 7) == first
    assert play(0, 8) != first
