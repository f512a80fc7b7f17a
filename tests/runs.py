"""The config files the end-to-end tests run, shared so no test module imports another."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.py"
SMOKE = f"{QUICKSTART}:smoke"  # the quickstart shrunk to minutes on two cores (configs/quickstart.py)


def smoke_config():
    from intraskill_jax import runconfig

    return runconfig.load_file(SMOKE)
