"""The job-wide progress display: its ETA against a hand computation on a fake clock."""

import io

import pytest

from intraskill_jax.progress import Planned, Progress, as_progress, compile_seconds, format_seconds


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def make(plan, compiling=None, **kw):
    clock = Clock()
    return Progress(plan, clock=clock, compiling=compiling or Clock(), file=io.StringIO(), **kw), clock


def test_priors_before_anything_runs():
    p, _ = make([Planned("a", 10, per_unit=2.0, startup=5.0), Planned("b", 4, per_unit=1.0)])
    assert p.remaining() == pytest.approx(5 + 20 + 4)


def test_running_stage_uses_its_rate_from_the_second_unit_and_rescales_later_priors():
    compiling = Clock()
    p, clock = make([Planned("a", 10, per_unit=2.0, startup=5.0), Planned("b", 4, per_unit=1.0)],
                    compiling=compiling)
    bar = p.stage("a")
    clock.t, compiling.t = 30.0, 25.0  # the first unit pays a long compile: it must not set the rate
    bar.update()
    assert p.remaining() == pytest.approx(9 * 2.0 + 4 * 1.0)
    clock.t = 34.0
    bar.update()  # 4 s per unit: twice the prior
    clock.t = 38.0
    bar.update()
    assert p.remaining() == pytest.approx(7 * 4.0 + 4 * 1.0 * 2.0)


def test_time_goes_to_the_innermost_stage_and_resumed_units_are_not_speed():
    p, clock = make([Planned("outer", 3, per_unit=10.0), Planned("inner", 2, per_unit=1.0)])
    outer = p.stage("outer", initial=1)  # one unit done by an earlier run
    clock.t = 10.0
    inner = p.stage("inner")
    clock.t = 15.0
    inner.update()
    clock.t = 17.0
    inner.update()
    inner.close()
    # inner: 2 units done; outer: 10 s charged, 1 of 3 done, none run here -> prior * speed - spent.
    speed = 2.0 / 1.0  # inner's rate (second unit: 2 s) over its prior
    assert p.remaining() == pytest.approx(max((0 + 2 * 10.0) * speed - 10.0, 0.0))
    assert "[1/2] outer 1/3" in p.status()
    outer.close()


def test_a_planned_stage_that_never_ran_counts_as_skipped_once_a_later_one_starts():
    p, _ = make([Planned("sft", 50, per_unit=3.0), Planned("eval", 10, per_unit=1.0)])
    p.stage("eval").close()
    assert p.remaining() == pytest.approx(10.0)


def test_unknown_cost_gives_no_eta_and_the_display_renders():
    out = io.StringIO()
    p = Progress(clock=Clock(), file=out)
    with p.stage("work", 5, unit="item") as bar:
        assert p.remaining() is None
        bar.update(loss=0.123456)
        assert "ETA ?" in p.status() and "loss=0.1235" in p.status()
    p.close()
    assert "[1/1] work 1/5 item" in out.getvalue()


def test_disabled_progress_writes_nothing():
    out = io.StringIO()
    p = as_progress(False)
    p._file = out
    with p.stage("x", 2) as bar:
        bar.update()
    assert out.getvalue() == "" and not p


def test_format_seconds():
    assert format_seconds(59.6) == "01:00"
    assert format_seconds(3725) == "1:02:05"


def test_units_completed_in_batches_rate_from_the_second_batch():
    p, clock = make([Planned("eval", 800, per_unit=0.2)])
    bar = p.stage("eval")
    clock.t = 60.0
    bar.update(200)  # first condition: includes compiling
    assert p.remaining() == pytest.approx(600 * 0.2)
    clock.t = 80.0
    bar.update(200)  # 0.1 s per episode
    assert p.remaining() == pytest.approx(400 * 0.1)


def after_training_at_30x_its_prior():
    """A bigger model's job after its training stage, which ran 30x its prior."""
    p, clock = make([Planned("sft", 3, per_unit=1.0), Planned("steps", 3, per_unit=10.0, kind="episodes"),
                     Planned("eval", 100, per_unit=1.0, kind="episodes")])
    with p.stage("sft") as bar:
        for t in (30.0, 60.0, 90.0):
            clock.t = t
            bar.update()
    return p, clock


def test_a_stage_without_a_rate_scales_by_its_own_kind_once_one_is_rated():
    # Episodes run 10x their priors. Before any episode stage has a rate they scale by the
    # training's speed; after, by their own kind's.
    p, clock = after_training_at_30x_its_prior()
    assert p.remaining() == pytest.approx((3 * 10.0 + 100 * 1.0) * 30.0)
    steps = p.stage("steps")
    for t in (190.0, 290.0):  # the first step 100 s (no compilation to speak of), the second 100 s
        clock.t = t
        steps.update()
    assert p.remaining() == pytest.approx(1 * 100.0 + 100 * 1.0 * 10.0)
    steps.close()


def test_a_stage_scales_by_the_nearest_of_its_kinds_that_has_run():
    # GRPO's steps ran 10x their prior; the first evaluation condition 40x: the second condition
    # scales by the first (its nearer kind), not by the steps.
    p, clock = make([Planned("steps", 3, per_unit=10.0, kind="episodes"),
                     Planned("eval a", 10, per_unit=1.0, kind=("evaluation", "episodes")),
                     Planned("eval b", 10, per_unit=1.0, kind=("evaluation", "episodes"))])
    with p.stage("steps") as bar:
        for t in (100.0, 200.0, 300.0):
            clock.t = t
            bar.update()
    assert p.remaining() == pytest.approx(2 * 10 * 1.0 * 10.0)  # before any condition: the steps' speed
    with p.stage("eval a") as bar:
        for k in range(10):
            clock.t = 300.0 + 40.0 * (k + 1)
            bar.update()
    assert p.remaining() == pytest.approx(10 * 1.0 * 40.0)


def test_a_stage_that_does_not_scale_keeps_its_prior():
    # The report's work does not grow with the model: 30x the training's prior does not make it 30x.
    p, clock = make([Planned("sft", 3, per_unit=1.0), Planned("report", 5, per_unit=2.5, scales=False)])
    with p.stage("sft") as bar:
        for t in (30.0, 60.0, 90.0):
            clock.t = t
            bar.update()
    assert p.remaining() == pytest.approx(5 * 2.5)


def test_a_first_unit_bounds_the_scaled_prior():
    p, clock = after_training_at_30x_its_prior()
    steps = p.stage("steps")
    clock.t = 250.0  # the first step, compilation included: 160 s, where 30x the prior says 300 s
    steps.update()
    speed = 160.0 / 10.0
    assert p.remaining() == pytest.approx(2 * 10.0 * speed + 100 * 1.0 * speed)
    steps.close()
    # A first unit slower than the prior, compiling apart, leaves the prior as it was.
    q, clock = make([Planned("steps", 3, per_unit=10.0, startup=35.0), Planned("eval", 10, per_unit=1.0)])
    steps = q.stage("steps")
    clock.t = 45.0
    steps.update()
    assert q.remaining() == pytest.approx(2 * 10.0 + 35.0 + 10 * 1.0)


def test_compiling_is_not_work():
    # The quickstart's second GRPO step met new shapes: 89 s, 85 of them compiling, where the
    # steps after took ~6 s of work. Counted as work, that one step set the speed of every stage
    # that plays episodes: ETA 29:45 with 2:46 left.
    compiling = Clock()
    p, clock = make([Planned("steps", 10, per_unit=10.0, kind="episodes"),
                     Planned("eval", 100, per_unit=1.0, kind="episodes")], compiling=compiling)
    steps = p.stage("steps")
    clock.t, compiling.t = 5.0, 3.0
    steps.update()  # the first step: 2 s of work bound the speed (0.2 of the prior's)
    assert p.remaining() == pytest.approx(9 * 10.0 * 0.2 + 100 * 1.0 * 0.2)
    clock.t, compiling.t = 94.0, 88.0
    steps.update()  # 89 s, 85 compiling: warm-up too (a new program's first run), the bound stands
    assert p.remaining() == pytest.approx(8 * 10.0 * 0.2 + 100 * 1.0 * 0.2)
    clock.t, compiling.t = 106.0, 93.0
    steps.update()  # 12 s, 5 compiling: 7 s of work
    assert p.remaining() == pytest.approx(7 * 7.0 + 100 * 1.0 * 0.7)
    clock.t = 114.0
    steps.update(0, loss=0.5)  # no unit: nothing measured
    steps.update()  # 8 s
    assert p.remaining() == pytest.approx(6 * 7.5 + 100 * 1.0 * 0.75)
    steps.close()
    assert p.elapsed() == pytest.approx(114.0)  # compiling is time spent all the same


def test_compiling_still_to_come_scales_by_the_finished_stages_compiling():
    compiling = Clock()
    p, clock = make([Planned("sft", 2, per_unit=1.0, startup=10.0),
                     Planned("steps", 4, per_unit=10.0, startup=20.0)], compiling=compiling)
    assert p.remaining() == pytest.approx(2 * 1.0 + 10.0 + 4 * 10.0 + 20.0)
    with p.stage("sft") as sft:
        clock.t, compiling.t = 12.0, 8.0
        sft.update()
        clock.t = 14.0
        sft.update()  # 2 s of work a unit: twice the prior; 8 s compiled of the 10 expected
    assert p.remaining() == pytest.approx(4 * 10.0 * 2.0 + 20.0 * 0.8)
    steps = p.stage("steps")
    clock.t, compiling.t = 30.0, 20.0
    steps.update()  # 12 s compiling, 4 s of work: 0.4 of the prior's
    assert p.remaining() == pytest.approx(3 * 10.0 * 0.4 + (20.0 * 0.8 - 12.0))
    steps.close()


def test_compile_time_is_the_union_of_nested_and_overlapping_spans():
    from intraskill_jax.progress import _CompileTime

    spans = _CompileTime()
    spans._listening = True  # fed by hand below
    for start, end in ((2.0, 5.0), (0.0, 10.0), (8.0, 12.0), (20.0, 21.0), (3.0, 4.0)):
        spans._record("/jax/core/compile/backend_compile_duration", start, end)
    spans._record("/jax/other/event", 30.0, 40.0)
    assert spans() == pytest.approx(12.0 + 1.0)


def test_compile_seconds_counts_what_jax_compiles():
    import time

    import jax
    import jax.numpy as jnp

    before, start = compile_seconds(), time.perf_counter()
    jax.jit(lambda x: jnp.cumsum(jnp.sin(x) @ x.T, axis=1))(jnp.ones((37, 53))).block_until_ready()
    wall = time.perf_counter() - start
    assert 0.0 < compile_seconds() - before <= wall
