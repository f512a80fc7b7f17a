"""The copy probe's data and one short run (the figures themselves come from the bench command)."""

import re

import numpy as np

from intraskill_jax.bench import copy_probe
from intraskill_jax.tokenization import train_tokenizer


def test_each_example_answers_with_the_first_listed_id():
    tokenizer = train_tokenizer(["Results: 12345 [SEP] blue pillow click:"] * 20, vocab_size=300)
    for ex in copy_probe.examples(tokenizer, 5, seed=3):
        prompt = tokenizer.decode(ex.token_ids[:ex.prompt_length])
        answer = tokenizer.decode(ex.token_ids[ex.prompt_length:])
        ids = re.findall(r"\b1\d{4}\b", prompt)
        assert len(ids) == 5 and answer == ids[0] + "\n"
        assert ex.loss_mask == [0] * ex.prompt_length + [1] * (len(ex.token_ids) - ex.prompt_length)


def test_probe_reports_a_chance_and_a_loss():
    row = copy_probe.probe("qwen3", updates=3, batch_size=2, learning_rate=1e-3)
    assert row["variant"] == "qwen3" and row["updates"] == 3
    assert 0.0 <= row["copy_chance"] < 0.01 and np.isfinite(row["final_loss"]) and row["final_loss"] > 1.0
