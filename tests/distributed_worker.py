"""One process of the two-process GRPO step in tests/test_distributed.py, and the step itself.

    INTRASKILL_NUM_PROCESSES=2 INTRASKILL_PROCESS_ID=i INTRASKILL_COORDINATOR=127.0.0.1:PORT \
    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4 \
        python -m tests.distributed_worker OUT.npz

    python -m tests.distributed_worker OUT.npz SHARED_DIR

Each process joins through `distributed.maybe_initialize()`, builds a mesh over the 8 devices of
both processes, runs one sharded GRPO update on the same deterministic batch, gathers the new
parameters to the host and writes them (with the step's metrics) to OUT.npz. The test process
imports `grpo_update` from here to compute the single-device reference, so both sides run
literally the same setup. Then the host side: an episode from a scripted engine whose reply
names the process that played it (every process must get process 0's), and one record written
into SHARED_DIR through `rundir` (by process 0 alone, read whole by both).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from intraskill_jax import distributed, rundir
from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec, run_episodes
from intraskill_jax.models import ModelConfig, causal_lm_class, sharding
from intraskill_jax.rl import train_step as ts
from intraskill_jax.rl.grpo import LossConfig
from intraskill_jax.rollout.base import SamplingParams, ScriptedEngine

CONFIG = ModelConfig.tiny_qwen3_5()  # the hybrid (DeltaNet + attention) layers the study trains
# eps raised so parameters with ~0 gradient move by ~0 rather than by +-lr on round-off signs.
OPTIM = ts.OptimConfig(learning_rate=1e-3, eps=1e-4, weight_decay=0.01, grad_clip=0.05, micro_batch_size=4)
LOSS = LossConfig(kl_coef=0.01)
TEMPERATURE = 0.8
# data crosses the process boundary (devices 0-3 are process 0's), fsdp and tensor split weights.
MESH = sharding.MeshConfig(data=2, fsdp=2, tensor=2)
ROWS, LENGTH = 8, 24


def grpo_batch(seed: int = 0) -> ts.TrainBatch:
    """Right-padded rows with sampled spans and off-policy old/ref log-probs; same on every process."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, CONFIG.vocab_size, (ROWS, LENGTH)).astype(np.int32)
    attention = np.zeros((ROWS, LENGTH), np.int32)
    loss_mask = np.zeros((ROWS, LENGTH), np.float32)
    for b in range(ROWS):
        n = int(rng.integers(LENGTH // 2, LENGTH + 1))
        attention[b, :n] = 1
        tokens[b, n:] = 0
        loss_mask[b, 4:n] = rng.random(n - 4) < 0.7
    sampled = loss_mask > 0
    rollout = np.where(sampled, -rng.random((ROWS, LENGTH)) * 4, 0).astype(np.float32)
    old = np.where(sampled, rollout + rng.normal(0, 0.3, rollout.shape), 0).astype(np.float32)
    ref = np.where(sampled, rollout + rng.normal(0, 0.1, rollout.shape), 0).astype(np.float32)
    collated = {"tokens": tokens, "attention_mask": attention, "loss_mask": loss_mask, "rollout_logprobs": rollout}
    advantages = rng.normal(size=ROWS).astype(np.float32)
    return ts.train_batch(collated, advantages=advantages, old_logprobs=old, ref_logprobs=ref)


def grpo_update(mesh: Mesh) -> tuple[ts.TrainState, ts.TrainState, dict[str, jax.Array]]:
    """(initial state, state after one GRPO update, metrics) with the model laid out on `mesh`."""
    model = sharding.create_sharded(lambda: causal_lm_class(CONFIG)(CONFIG, rngs=nnx.Rngs(3)), mesh)
    tx = ts.make_optimizer(OPTIM)
    graphdef, state = ts.init_train_state(model, tx, mesh=mesh)
    step = ts.grpo_step(graphdef, tx, OPTIM, LOSS, temperature=TEMPERATURE, mesh=mesh, donate=False)
    new_state, metrics = step(state, grpo_batch())
    return state, new_state, metrics


SCRIPTED_REPLY = "played by process {process}"


def host_side_episode(me: int) -> str:
    """The reply of one episode played by a scripted engine (a host-side client, as a rollout
    server is) whose script answers with this process's index."""
    from sim.config import CatalogConfig, SimConfig, SplitConfig
    from sim.env import ShopEnv
    from sim.world import build_world

    from intraskill_jax.tokenization import IM_END, train_tokenizer

    world = build_world(SimConfig(catalog=CatalogConfig(num_products=60), splits=SplitConfig(num_test=5, num_validation=5)))
    tok = train_tokenizer(["search click buy played by process 0 1"], 300, tool_format="xml")
    engine = ScriptedEngine(lambda s: tok.encode(s, add_special_tokens=False),
                            lambda session, ids: SCRIPTED_REPLY.format(process=me), tok.convert_tokens_to_ids(IM_END))
    (traj,) = run_episodes(engine, [ShopEnv(world)], tok, [EpisodeSpec(int(world.splits.train[0]))],
                           SamplingParams(max_new_tokens=32), AgentConfig(tool_format="xml", max_turns=1))
    sampled = [t for t, m in zip(traj.token_ids, traj.loss_mask) if m]
    return json.dumps(tok.decode(sampled, skip_special_tokens=True).strip())


def host_side_failures(me: int, shared: Path) -> dict[str, np.ndarray]:
    """What process 0's failures and host-side calls look like on both processes."""
    import httpx

    from intraskill_jax.rollout.base import WeightUpdate
    from intraskill_jax.rollout.sglang import SGLangEngine

    out: dict[str, np.ndarray] = {}
    # process 0's exception reaches everyone, as an error (no process waits for a result).
    def fail() -> None:
        raise KeyError(f"raised on process {me}")

    try:
        distributed.from_main(fail)
        out["from_main_error"] = np.array("none")
    except Exception as e:  # process 0 re-raises its own; the others get a RuntimeError naming it
        out["from_main_error"] = np.array(f"{type(e).__name__}: {e}")
    # A collective inside process 0's function is refused, not a deadlock.
    out["nested_collective"] = np.array(repr(distributed.from_main(
        lambda: _refused(lambda: distributed.sync("inside")))))
    # A large payload crosses in pieces.
    big = distributed.from_main(lambda: bytes(range(256)) * (distributed.BROADCAST_PIECE // 256 + 3))
    out["big_ok"] = np.array(big == bytes(range(256)) * (distributed.BROADCAST_PIECE // 256 + 3))
    # The rollout server hears from process 0 alone; the export is everyone's.
    posts: list[str] = []
    client = httpx.Client(transport=httpx.MockTransport(lambda r: posts.append(r.url.path) or httpx.Response(200, json={})))
    engine = SGLangEngine("http://server", client=client)
    engine.update_weights(WeightUpdate(version=3, load_model=lambda: None, publish=lambda: shared / "weights"))
    out["posts"] = np.array(",".join(posts))
    out["weight_version"] = np.array(engine.weight_version)
    # A directory published by process 0 whose callback writes through rundir (as the bundle's does),
    # and a removal: one write each, no barrier of their own.
    rundir.publish_dir(shared / "bundle", lambda tmp: rundir.write_text(tmp / "a.txt", f"from {me}"))
    rundir.write_text(shared / "stale.txt", "x")
    rundir.remove(shared / "stale.txt")
    out["published"] = np.array((shared / "bundle" / "a.txt").read_text())
    out["removed"] = np.array(not (shared / "stale.txt").exists())
    return out


def _refused(fn: Any) -> str:
    try:
        fn()
    except RuntimeError as e:
        return str(e)
    return "ran"


def flat(tree: Any, prefix: str) -> dict[str, np.ndarray]:
    """Path-keyed host arrays, for np.savez and for comparing trees leaf by leaf."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {prefix + jax.tree_util.keystr(path): np.asarray(x) for path, x in leaves}


def main(out_path: str, shared_dir: str) -> None:
    # gloo is JAX's default CPU collectives backend in recent releases; older ones had none, and
    # without one a cross-process psum on CPU fails. Set before the backend starts.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if not distributed.maybe_initialize(timeout_s=120):
        raise SystemExit("expected INTRASKILL_NUM_PROCESSES > 1 in the environment")
    assert distributed.maybe_initialize()  # idempotent
    me = jax.process_index()
    assert jax.process_count() == 2 and jax.device_count() == 8, (jax.process_count(), jax.device_count())
    assert distributed.is_main_process() == (me == 0)

    initial, new_state, metrics = grpo_update(sharding.make_mesh(MESH))
    # The step must really span both processes, else the test would prove nothing.
    split = sum(not x.is_fully_addressable for x in jax.tree.leaves(new_state.params))
    token = distributed.broadcast_from_main(np.array([10 * me + 7], np.int32))
    out = {
        **flat(distributed.gather_to_host(initial.params), "initial"),
        **flat(distributed.gather_to_host(new_state.params), "params"),
        **flat(distributed.gather_to_host(metrics), "metrics"),
        "cross_process_leaves": np.array(split),
        "process_index": np.array(me),
        "broadcast": np.asarray(token),
        "episodes": np.array(host_side_episode(me)),
    }
    record = Path(shared_dir) / "record.json"
    rundir.write_json(record, {"written_by": me})
    assert json.loads(record.read_text()) == {"written_by": 0}  # whole, and process 0's, on both
    out.update(host_side_failures(me, Path(shared_dir)))
    distributed.sync("gathered")
    np.savez(out_path, **out)
    distributed.sync("written")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
