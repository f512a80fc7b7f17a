"""Every command reads its flags one way (sim/flagparse.py): `--help` lists the command's own flags,
a bad flag is one line naming the command with exit status 2. Nothing here runs a model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from intraskill_jax import cli
from intraskill_jax.bench import copy_probe, learn_shop, model, rollout, sampler
from intraskill_jax.skills import power

from tests.runs import REPO, SMOKE


def _intraskill(command):
    return lambda argv: cli.main(["intraskill", command, *argv])


# (entry point, the name it reports, flags its help lists, a flag spelling it must refuse)
COMMANDS = [
    *[(_intraskill(c), f"intraskill {c}", ("--config:", "--workdir:", "--conditions:", "--[no]quiet:", "--k:"),
       "--work_dir=runs/x") for c in ("sft", "train", "eval", "rank", "multiseed")],
    (_intraskill("report"), "intraskill report", ("--workdir:", "--out:", "--[no]quiet:"), "--no-quiet"),
    (_intraskill("check-bundle"), "intraskill check-bundle", (), "--verify"),
    (_intraskill("compile-check"), "intraskill compile-check", ("--config:", "--topology:", "--mfu:", "--programs:"),
     "--search-micro-batch"),
    (_intraskill("serve"), "intraskill serve", ("--model-path:", "--host:", "--port:", "--max-batch:", "--dtype:"),
     "--model_path=/m"),
    (_intraskill("sim-demo"), "intraskill sim-demo", ("--config:", "--episodes:"), "--episode=3"),
    (_intraskill("fetch-model"), "intraskill fetch-model", ("--cache-dir:", "--wheel:"), "--cache_dir=/tmp/c"),
    (model.main, "python -m intraskill_jax.bench.model", ("--size:", "--kernels:", "--[no]skip-reference:"),
     "--skip_reference"),
    (rollout.main, "python -m intraskill_jax.bench.rollout",
     ("--episodes:", "--new-tokens:", "--update-repeats:", "--[no]skill:"), "--new_tokens=8"),
    (sampler.main, "python -m intraskill_jax.bench.sampler", ("--episodes:", "--setting:", "--[no]skill:"),
     "--model_path=/m"),
    (learn_shop.main, "python -m intraskill_jax.bench.learn_shop", ("--config:", "--workdir:", "--[no]progress:"),
     "--dry-run"),
    (copy_probe.main, "python -m intraskill_jax.bench.copy_probe", ("--variants:", "--batch-size:", "--learning-rate:"),
     "--lr=0.1"),
    (power.main, "python -m intraskill_jax.skills.power", ("--replicates:", "--n-tasks:", "--seed:"), "--n_tasks=5"),
]


@pytest.mark.parametrize("main,prog,own,bad", COMMANDS, ids=[c[1] for c in COMMANDS])
def test_help_lists_the_commands_flags_and_a_bad_flag_is_one_line(capsys, main, prog, own, bad):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {prog}"), out[:200]
    assert all(f"\n  {flag}" in out for flag in own), out
    assert "--flagfile" not in out and "--verbosity" not in out  # the command's flags, not absl's
    with pytest.raises(SystemExit) as e:
        main([bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{prog}: ") and err.count("\n") == 1 and f"`{prog} --help`" in err, err


@pytest.mark.parametrize("main,argv,message", [
    (model.main, ["--kernels=default,gpu"], "flag --kernels=['default', 'gpu']: one or more of default, cpu"),
    (model.main, ["--size=huge"], "flag --size=huge: value should be one of <4b|quickstart|small|smollm2>"),
    (copy_probe.main, ["--variants=transformer"], "flag --variants=['transformer']: one or more of hybrid"),
    (_intraskill("serve"), ["--port=30000"], "Flag --model-path must have a value other than None"),
    (_intraskill("report"), ["--workdir=gs:/bucket/run"], "looks like a gs:// URL that lost a slash"),
    (_intraskill("check-bundle"), [], "takes DIR, got []"),
    (_intraskill("fetch-model"), [], "takes NAME, got []"),
    (_intraskill("fetch-model"), ["smollm9"], "unknown checkpoint 'smollm9'; known: smollm2-135m-instruct"),
    (_intraskill("compile-check"), [f"--config={SMOKE}"], "Flag --topology must have a value other than None"),
    (_intraskill("train"), ["--workdir=runs/x"], "--config is required (e.g. --config=configs/quickstart.py)"),
    (_intraskill("eval"), [f"--config={SMOKE}"], "--workdir is required"),
    (_intraskill("quickstart"), ["--work_dir=runs/x"], "Unknown command line flag 'work_dir'"),
    (_intraskill("eval"), [f"--config={SMOKE}", "--workdir=runs/x", "--conditions=base_bare,zero_shot"],
     "--conditions: unknown condition 'zero_shot'"),
    (_intraskill("rank"), [f"--config={SMOKE}", "--workdir=runs/x", "--k=0"], "--k: k must be >= 1, got 0"),
])
def test_bad_values_and_missing_flags_are_usage_errors(capsys, main, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_the_console_entry_point_exits_2_with_one_line():
    done = subprocess.run([sys.executable, "-m", "intraskill_jax.cli", "serve", "--port", "30000", "--bogus"],
                          capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "intraskill serve: Unknown command line flag 'bogus' (`intraskill serve --help` lists its flags)"]
