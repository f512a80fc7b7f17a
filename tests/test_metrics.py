import math

import pytest

from intraskill_jax.metrics import MetricsWriter, read_metrics


def test_jsonl_and_tensorboard_get_the_same_scalars(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.write(1, {"train/pg_loss": 0.5, "rollout/success": 1, "perf/tokens_per_s": float("nan")})
        w.write(2, {"train/pg_loss": 0.25})
        w.text(2, "skills/bank", "chunk text")
    rows = read_metrics(tmp_path)
    assert rows[0] == {"step": 1, "train/pg_loss": 0.5, "rollout/success": 1.0, "perf/tokens_per_s": None}
    assert rows[1] == {"step": 2, "train/pg_loss": 0.25}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("train/pg_loss")] == [0.5, 0.25]
    assert math.isnan(acc.Scalars("perf/tokens_per_s")[0].value)


def test_unscoped_names_fail_and_a_torn_last_line_is_skipped(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        with pytest.raises(ValueError, match="prefixes"):
            w.write(0, {"loss": 1.0})
        w.write(0, {"train/loss": 1.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 1, "train/lo')
    assert read_metrics(tmp_path) == [{"step": 0, "train/loss": 1.0}]
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.write('garbage\n{"step": 1}\n')
    with pytest.raises(ValueError, match="line 1"):
        read_metrics(tmp_path)


def test_rewind_drops_rows_after_the_restored_step_and_purges_tensorboard(tmp_path):
    with MetricsWriter(tmp_path) as w:
        for step in (1, 2, 3):
            w.write(step, {"train/pg_loss": float(step)})
        w.write(2, {"gate/bare_reward": 0.5})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "train/pg')  # torn by a kill
    # A run restored at step 2 redoes step 3 and, here, its gate at step 2.
    with MetricsWriter(tmp_path, rewind_to=2) as w:
        assert w.rewind(lambda r: r["step"] == 2 and any(k.startswith("gate/") for k in r)) == 1
        w.write(3, {"train/pg_loss": 30.0})
    rows = read_metrics(tmp_path)
    assert rows == [{"step": 1, "train/pg_loss": 1.0}, {"step": 2, "train/pg_loss": 2.0},
                    {"step": 3, "train/pg_loss": 30.0}]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/pg_loss")] == [(1, 1.0), (2, 2.0), (3, 30.0)]
