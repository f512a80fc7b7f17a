"""`intraskill compile-check`: a config's programs compiled for a TPU slice on this CPU machine.

The compile tests need libtpu (`pip install 'jax[tpu]'`; no TPU) and skip without it.
"""

import importlib.util
import logging
import math

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, PartitionSpec

from intraskill_jax import compile_check, runconfig
from intraskill_jax.models import ModelConfig, causal_lm_class
from intraskill_jax.models import sharding as sharding_lib

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="compile-check compiles for TPU topologies through libtpu, which is not installed "
           f"(pip install 'jax[tpu]=={jax.__version__}'; no TPU needed)")

# Two layers, one of each kind, a short context and small batches: the programs a run jits, at a
# size that compiles in seconds. fsdp=2 x tensor=2 on the four chips of v5p:2x2x1 splits some
# parameters over both axes, some over one and leaves the norms whole.
TINY = {
    "policy.init": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, linear_key_head_dim=16, linear_value_head_dim=8,
                        layer_types=("linear_attention", "full_attention")),
    "policy.tokenizer_vocab_size": 256,
    "policy.remat": "full",
    "agent.max_context_tokens": 256,
    "train.groups_per_step": 2, "train.group_size": 2, "train.optim.micro_batch_size": 2,
    "rollout.sampler.max_batch": 4, "rollout.sampler.max_length": 512, "rollout.sampler.prefill_buckets": (64,),
    "rollout.sampler.decode_buckets": (16,), "rollout.sampling.max_new_tokens": 16,
    "mesh.data": 1, "mesh.fsdp": 2, "mesh.tensor": 2,
}


def tiny_config(**overrides):
    return runconfig.with_overrides(runconfig.load_file("configs/quickstart.py"), {**TINY, **overrides})


def predicted_param_bytes(model_config, mesh_shape):
    """Per-chip bytes of every parameter under the sharding rules: its bytes over the product of
    the mesh axes its partition spec names."""
    mesh = AbstractMesh(tuple(mesh_shape.values()), tuple(mesh_shape))
    model = nnx.eval_shape(lambda: causal_lm_class(model_config)(model_config, rngs=nnx.Rngs(0)))
    total = 0
    for _, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = var.get_value()
        spec = sharding_lib.logical_to_spec(sharding_lib.logical_axes(var), value.shape, mesh)
        axes = [a for entry in spec if entry for a in ((entry,) if isinstance(entry, str) else entry)]
        shards = math.prod(mesh_shape[a] for a in axes)
        nbytes = math.prod(value.shape) * jnp.dtype(value.dtype).itemsize
        assert nbytes % shards == 0
        total += nbytes // shards
    return total


@needs_libtpu
def test_parameter_bytes_per_chip_follow_the_sharding_rules():
    config = tiny_config()
    report = compile_check.check(config, compile_check.parse_topology("v5p:2x2x1"))
    assert report.chips == 4 and report.mesh == {"data": 1, "fsdp": 2, "tensor": 2}
    assert [p.name for p in report.programs] == ["prefill", "decode", "train_step", "logprobs"]
    model_config, _ = compile_check.model_config(config)
    assert model_config.dtype == "bfloat16" and model_config.remat == "full"  # 'auto' means the TPU's dtype
    params = predicted_param_bytes(model_config, report.mesh)
    # The embedding alone: [vocab 256, hidden 64] bf16, vocab over tensor and hidden over fsdp.
    assert params > 256 * 64 * 2 // 4
    for program in report.programs:  # the sampler holds the trainer's parameters in the same layout
        assert program.fits and program.arguments["params"] == params, program.name
    step = report.programs[2]
    # AdamW keeps two moments shaped like the parameters (same layout), plus scalar counters.
    assert 0 <= step.arguments["optimizer"] - 2 * params < 64
    assert step.argument_bytes >= sum(step.arguments.values()) and step.total_bytes >= step.argument_bytes
    # The quickstart samples in process: its cache stays allocated through the update.
    assert step.resident_bytes == report.programs[1].arguments["cache"] > 0
    assert step.flops > 0 and step.seconds == pytest.approx(step.flops / (459e12 * 0.4))


# The tiny config's parameters written out by hand (bfloat16, 2 bytes each), with the mesh axes each
# is meant to be split over (DESIGN.md, the logical-axis rules): a model dimension ('embed') over
# fsdp, heads, MLP width and vocabulary over tensor, norms whole. Per chip: its bytes over the
# product of those axes' sizes. Two slices: v5p:2x2x1 (fsdp 2 x tensor 2) and v5p:2x2x2 (fsdp 4 x
# tensor 2); every dimension divides, so nothing falls back to being replicated.
HAND_PARAMETERS = [  # (name, shape, mesh axes)
    ("model.embed_tokens", (256, 64), ("tensor", "fsdp")),
    ("lm_head", (256, 64), ("tensor", "fsdp")),
    ("model.norm", (64,), ()),
    # layer 0, Gated DeltaNet: q, k and v heads (2 x 16 + 2 x 16 + 4 x 8 = 96 channels), 4 value heads
    ("0.input_layernorm", (64,), ()),
    ("0.linear_attn.in_proj_qkv", (96, 64), ("tensor", "fsdp")),
    ("0.linear_attn.in_proj_z", (32, 64), ("tensor", "fsdp")),
    ("0.linear_attn.in_proj_a", (4, 64), ("tensor", "fsdp")),
    ("0.linear_attn.in_proj_b", (4, 64), ("tensor", "fsdp")),
    ("0.linear_attn.conv1d", (96, 1, 4), ("tensor",)),
    ("0.linear_attn.A_log", (4,), ("tensor",)),
    ("0.linear_attn.dt_bias", (4,), ("tensor",)),
    ("0.linear_attn.norm", (8,), ()),
    ("0.linear_attn.out_proj", (64, 32), ("fsdp", "tensor")),
    ("0.post_attention_layernorm", (64,), ()),
    ("0.mlp.gate_proj", (128, 64), ("tensor", "fsdp")),
    ("0.mlp.up_proj", (128, 64), ("tensor", "fsdp")),
    ("0.mlp.down_proj", (64, 128), ("fsdp", "tensor")),
    # layer 1, gated attention: 4 query heads of 16 (doubled by the output gate), 2 key/value heads
    ("1.input_layernorm", (64,), ()),
    ("1.self_attn.q_proj", (128, 64), ("tensor", "fsdp")),
    ("1.self_attn.k_proj", (32, 64), ("tensor", "fsdp")),
    ("1.self_attn.v_proj", (32, 64), ("tensor", "fsdp")),
    ("1.self_attn.o_proj", (64, 64), ("fsdp", "tensor")),
    ("1.self_attn.q_norm", (16,), ()),
    ("1.self_attn.k_norm", (16,), ()),
    ("1.post_attention_layernorm", (64,), ()),
    ("1.mlp.gate_proj", (128, 64), ("tensor", "fsdp")),
    ("1.mlp.up_proj", (128, 64), ("tensor", "fsdp")),
    ("1.mlp.down_proj", (64, 128), ("fsdp", "tensor")),
]
# The sums of the table, worked by hand: 218,112 bytes of matrices split over both axes, 784 bytes
# of DeltaNet vectors and conv over tensor, 720 bytes of norms whole.
HAND_PARAM_BYTES = {"v5p:2x2x1": 218_112 // 4 + 784 // 2 + 720, "v5p:2x2x2": 218_112 // 8 + 784 // 2 + 720}
SLICES = {"v5p:2x2x1": {"mesh.fsdp": 2}, "v5p:2x2x2": {"mesh.fsdp": 4}}


def test_the_hand_table_adds_up_to_the_hand_sums_and_lists_the_models_parameters():
    for topology, overrides in SLICES.items():
        mesh = {"fsdp": overrides["mesh.fsdp"], "tensor": 2}
        total = sum(math.prod(shape) * 2 // math.prod(mesh[a] for a in axes) for _, shape, axes in HAND_PARAMETERS)
        assert total == HAND_PARAM_BYTES[topology], topology
    model_config, _ = compile_check.model_config(tiny_config())
    model = nnx.eval_shape(lambda: causal_lm_class(model_config)(model_config, rngs=nnx.Rngs(0)))
    params = [var.get_value() for _, var in nnx.to_flat_state(nnx.state(model, nnx.Param))]
    assert {jnp.dtype(p.dtype) for p in params} == {jnp.dtype(jnp.bfloat16)}
    assert sorted(p.shape for p in params) == sorted(shape for _, shape, _ in HAND_PARAMETERS)


@needs_libtpu
@pytest.mark.parametrize("topology", SLICES)
def test_parameter_bytes_per_chip_match_the_hand_figure(topology):
    """The check's per-chip parameter bytes against the hand table, not against the project's own
    rules. Sabotage checked: the 'embed' rule sending nothing to fsdp (a copy of the package with
    ("embed", None)) leaves `test_parameter_bytes_per_chip_follow_the_sharding_rules` passing and
    fails this test on both slices."""
    report = compile_check.check(tiny_config(**SLICES[topology]), compile_check.parse_topology(topology),
                                 programs=("train_step",))
    assert report.chips == 4 * SLICES[topology]["mesh.fsdp"] // 2
    (step,) = report.programs
    assert step.error is None and step.arguments["params"] == HAND_PARAM_BYTES[topology]


@needs_libtpu
def test_an_unsharded_parameter_shows_as_more_memory_than_the_hand_figure(monkeypatch):
    """The embedding and the head laid out whole on every chip (their spec emptied where the rules
    are applied): the check reports exactly their missing split, 2 x 32,768 x 3/4 bytes more."""
    real = sharding_lib.logical_to_spec

    def whole_vocabulary(axes, shape, mesh, rules=sharding_lib.DEFAULT_RULES):
        return PartitionSpec() if axes is not None and tuple(axes) == ("vocab", "embed") else real(axes, shape, mesh,
                                                                                                    rules)

    monkeypatch.setattr(sharding_lib, "logical_to_spec", whole_vocabulary)
    report = compile_check.check(tiny_config(), compile_check.parse_topology("v5p:2x2x1"), programs=("train_step",))
    (step,) = report.programs
    assert step.arguments["params"] == HAND_PARAM_BYTES["v5p:2x2x1"] + 2 * 32_768 * 3 // 4


@needs_libtpu
def test_scanned_layers_compile_for_the_slice_with_the_unrolled_arguments():
    # Two repeats of a two-layer period: the update takes the parameters and optimizer state in the
    # layout it takes unrolled (stacking happens inside the program) and compiles on the 4 chips.
    layers = {**TINY["policy.init"], "num_hidden_layers": 4,
              "layer_types": ("linear_attention", "full_attention") * 2}
    topology = compile_check.parse_topology("v5p:2x2x1")
    steps = [compile_check.check(tiny_config(**{"policy.init": layers, "policy.scan_layers": scan}), topology,
                                 programs=("train_step",)).programs[0] for scan in (False, True)]
    unrolled, scanned = steps
    assert compile_check.model_config(tiny_config(**{"policy.scan_layers": True}))[0].scan_layers
    assert scanned.fits and scanned.error is None and scanned.arguments == unrolled.arguments
    assert scanned.flops == pytest.approx(unrolled.flops, rel=0.01)


@needs_libtpu
def test_a_setting_too_large_for_the_chip_exits_nonzero_naming_the_knobs(caplog):
    # The quickstart's one attention layer with 512 rows x 128K slots: 2 x 512 x 2 heads x 131072 x
    # 32 dims of bfloat16 keys and values is 16 GiB, on every chip (the cache starts replicated).
    argv = ["--config=configs/quickstart.py", "--topology=v5e-4", "--programs=prefill",
            "--config.rollout.sampler.max_batch=512", "--config.rollout.sampler.max_length=131072",
            "--config.rollout.sampler.prefill_buckets=(32,)"]
    with caplog.at_level(logging.ERROR, logger="intraskill_jax.compile_check"), pytest.raises(SystemExit) as exit_:
        compile_check.main(argv)
    assert exit_.value.code == 1
    message = " ".join(r.getMessage() for r in caplog.records)
    assert "prefill" in message and "v5e-4" in message
    for knob in ("rollout.sampler.max_batch (now 512)", "rollout.sampler.max_length (now 131072)", "mesh.fsdp"):
        assert knob in message


@needs_libtpu
def test_flops_per_chip_count_every_loop_iteration_on_each_chips_rows():
    topology = compile_check.parse_topology("v5p:2x2x1")
    mesh = jax.make_mesh((4,), ("fsdp",), devices=topology.devices(), axis_types=(jax.sharding.AxisType.Auto,))
    xs = jax.ShapeDtypeStruct((6, 512, 256), jnp.bfloat16, sharding=jax.NamedSharding(mesh, jax.P(None, "fsdp")))
    w = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16, sharding=jax.NamedSharding(mesh, jax.P()))

    def program(xs, w):
        return jax.lax.scan(lambda c, x: (c + jnp.tanh(x @ w).sum(), None), 0.0, xs)[0]

    args = (xs, w)
    traced = jax.jit(program).trace(*args)
    report = compile_check.measure(
        compile_check.Program(name="scan", traced=traced, args=args, group=lambda path: "inputs", while_trips=1,
                              runs=True, knobs=()), topology.chip, 0.5)
    # Six [512, 256] @ [256, 256] products, each chip multiplying its 128 of the 512 rows.
    assert report.flops == pytest.approx(6 * 2 * 128 * 256 * 256, rel=0.01)
    assert report.arguments == {"inputs": (6 * 128 * 256 + 256 * 256) * 2}


def test_topology_names_map_to_chip_grids():
    assert compile_check.parse_topology("v5p-8").chips == 4  # v5p-N counts TensorCores, two per chip
    assert compile_check.parse_topology("v5p-64").shape == "2x4x4"
    assert compile_check.parse_topology("v6e-64").chips == 64 and compile_check.parse_topology("v5e-16").shape == "4x4"
    assert compile_check.parse_topology("v6e:2x4").chips == 8
    with pytest.raises(compile_check.CompileCheckError, match="v5p-8"):
        compile_check.parse_topology("v7x-8")


def test_matmul_flops_run_scans_to_their_length_and_while_loops_their_trips():
    w = jnp.ones((8, 16))

    def program(xs):
        def body(carry, x):
            return carry + jax.lax.cond(x.sum() > 0, lambda x: x @ w, lambda x: jnp.zeros((4, 16)), x).sum(), None

        scanned = jax.lax.scan(body, 0.0, xs)[0]
        looped = jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] @ w @ w.T), (0, xs[0]))[1]
        return scanned + looped.sum()

    jaxpr = jax.make_jaxpr(program)(jnp.ones((5, 4, 8))).jaxpr
    one = 2 * 4 * 8 * 16  # a [4, 8] @ [8, 16] product
    once, full = compile_check.matmul_flops(jaxpr, while_trips=3)
    assert once == one + 2 * one  # the scanned product, and the loop's two products
    assert full == 5 * one + 3 * 2 * one


def test_model_config_falls_back_to_the_published_architecture_for_a_placeholder_path():
    config = runconfig.load_file("configs/qwen3_4b.py")
    model_config, source = compile_check.model_config(config)
    assert model_config == ModelConfig.qwen3_4b(dtype="bfloat16", param_dtype="bfloat16", remat="full",
                                                scan_layers=True)
    assert "qwen3_4b" in source and config.policy.path in source


def test_a_tensor_axis_that_splits_the_chip_grid_makes_a_mesh():
    # fsdp=32 x tensor=2 on v6e-64 (8x8 chips): jax.make_mesh alone refuses to split a grid axis there.
    devices = compile_check.parse_topology("v6e-64").devices()
    mesh = sharding_lib.make_mesh(sharding_lib.MeshConfig(fsdp=-1, tensor=2), devices)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 32, "tensor": 2}
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)


@needs_libtpu
def test_a_llama_checkpoint_compiles_for_the_slice(tmp_path):
    """policy.path naming a Llama checkpoint: every program compiles on the 4 chips and holds the
    parameters the rules predict (no q/k norms, untied head); its sampler's decode with drafted
    tokens and halvings, as the config sets them."""
    import json

    from intraskill_jax.models import hf_config

    llama = ModelConfig.tiny_llama(vocab_size=256)
    (tmp_path / "config.json").write_text(json.dumps(hf_config(llama)))
    config = tiny_config(**{"policy.path": str(tmp_path), "rollout.sampler.draft_tokens": 3,
                            "rollout.sampler.decode_halvings": 1})
    report = compile_check.check(config, compile_check.parse_topology("v5p:2x2x1"))
    model_config, source = compile_check.model_config(config)
    assert model_config.family == "llama" and source == f"{tmp_path}/config.json"
    params = predicted_param_bytes(model_config, report.mesh)
    for program in report.programs:
        assert program.fits and program.error is None and program.arguments["params"] == params, program.name
    decode = next(p for p in report.programs if p.name == "decode")
    s = config.rollout.sampler
    history = s.max_batch * (s.max_length + s.decode_steps(config.rollout.sampling.max_new_tokens)) * 4
    assert decode.arguments["inputs"] >= history  # the rows' histories the drafts are read from


@needs_libtpu
def test_lora_with_a_kl_penalty_compiles_with_the_adapters_moments_only():
    topology = compile_check.parse_topology("v5p:2x2x1")
    full, lora = (compile_check.check(tiny_config(**overrides), topology, programs=("train_step",)).programs[0]
                  for overrides in ({}, {"train.lora.enabled": True, "train.lora.rank": 4, "train.loss.kl_coef": 0.05}))
    assert lora.fits and lora.error is None
    # The adapters' two moments (rank 4 on the attention and MLP projections) against every parameter's.
    assert lora.arguments["optimizer"] < 0.25 * full.arguments["optimizer"]
    assert lora.arguments["params"] > full.arguments["params"]  # the base weights plus the adapters
    assert lora.arguments["batch"] > full.arguments["batch"]  # the reference's log-probs
