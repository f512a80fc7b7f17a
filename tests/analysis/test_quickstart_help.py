"""`intraskill quickstart --help`: a short usage of the quickstart's own flags, exit status 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_quickstart_help_lists_its_flags() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "intraskill_jax.cli", "quickstart", "--help"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith("usage: intraskill quickstart")
    assert "--workdir=DIR" in out and "(default: runs/quickstart)" in out
    assert "--quiet" in out and "--config.FIELD=VALUE" in out and "configs/quickstart.py" in out
    assert len(out.splitlines()) < 40  # the quickstart's flags, not absl's dump of every module's


def test_config_overrides_need_no_config_file() -> None:
    from intraskill_jax.main import QUICKSTART, _quickstart_args

    assert _quickstart_args(["--config.train.rounds=1"]) == [f"--config={QUICKSTART}", "--config.train.rounds=1"]
    mine = ["--config=configs/other.py", "--config.train.rounds=1"]
    assert _quickstart_args(mine) == mine
