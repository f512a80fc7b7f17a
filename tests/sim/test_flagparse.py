"""sim/flagparse.py, the one way every command reads its flags, and the simulator's own commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from absl import flags

from sim import __main__ as sim_main
from sim import bench, flagparse

REPO = Path(__file__).resolve().parents[2]


def _define(values: flags.FlagValues) -> None:
    flags.DEFINE_string("model-path", None, "a required path", required=True, flag_values=values)
    flags.DEFINE_integer("port", 30000, "a port", flag_values=values)
    flags.DEFINE_bool("json", False, "one JSON object", flag_values=values)


def _parse(argv, **kw):
    return flagparse.parse("demo-cmd", "What demo-cmd does.", _define, argv, **kw)


def test_values_by_name_with_dashes_as_underscores_and_positionals():
    args = _parse(["--model-path", "/m", "--port=1", "--json", "DIR"], positional=("dir",))
    assert (args.model_path, args.port, args.json, args.dir) == ("/m", 1, True, "DIR")
    args = _parse(["DIR", "--model-path=/m", "--nojson"], positional=("dir",))  # positionals anywhere
    assert (args.model_path, args.port, args.json, args.dir) == ("/m", 30000, False, "DIR")


def test_flags_from_a_file(tmp_path):
    (tmp_path / "flags.txt").write_text("--model-path=/f\n--port=7\n")
    args = _parse([f"--flagfile={tmp_path / 'flags.txt'}"])
    assert (args.model_path, args.port) == ("/f", 7)


def test_help_lists_the_commands_own_flags_only(capsys):
    with pytest.raises(SystemExit) as e:
        _parse(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: demo-cmd [flags]\n\nWhat demo-cmd does.\n\nflags:\n")
    assert "--model-path: a required path" in out and "--[no]json" in out and "(default: '30000')" in out
    assert "flagfile" not in out and "verbosity" not in out and "demo.py" not in out  # not absl's, no module names


@pytest.mark.parametrize("argv,message", [
    (["--model-path=/m", "--bogus"], "Unknown command line flag 'bogus'"),
    (["--model-path=/m", "--port=abc"], "flag --port=abc: invalid literal for int()"),
    (["--model-path=/m", "--json=maybe"], "flag --json=maybe: ('Non-boolean argument"),
    (["--port=1"], "Flag --model-path must have a value other than None"),
    (["--model-path=/m", "extra"], "takes no positional arguments, got ['extra']"),
])
def test_a_bad_command_line_is_one_line_and_exit_status_2(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        _parse(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("demo-cmd: ") and message in err and err.count("\n") == 1, err


# -- the simulator's commands --------------------------------------------------------------------


@pytest.mark.parametrize("main,prog,own", [
    (sim_main.main, "python -m sim", ("--config:", "--episodes:")),
    (bench.main, "python -m sim.bench", ("--[no]skip-1m:", "--rank-bm25-queries:", "--env-steps:", "--products:")),
])
def test_sim_commands_help_and_bad_flags(capsys, main, prog, own):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {prog} ") and all(f"  {flag}" in out for flag in own), out
    with pytest.raises(SystemExit) as e:
        main(["--skip_1m"])
    assert e.value.code == 2 and capsys.readouterr().err.startswith(f"{prog}: Unknown command line flag 'skip_1m'")


def test_sim_names_its_commands(capsys):
    with pytest.raises(SystemExit) as e:
        sim_main.main(["frobnicate"])
    assert e.value.code == 2 and "the command is one of demo, serve; got 'frobnicate'" in capsys.readouterr().err


def test_python_m_sim_bench_exits_2_on_a_bad_flag():
    done = subprocess.run([sys.executable, "-m", "sim.bench", "--queries=many"], capture_output=True, text=True,
                          cwd=REPO, timeout=120, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [("python -m sim.bench: flag --queries=many: invalid literal for int() with "
                                         "base 10: 'many' (`python -m sim.bench --help` lists its flags)")]
