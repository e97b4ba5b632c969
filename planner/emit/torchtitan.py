"""torchtitan launch for a training configuration: a TOML job config and the torchrun line that
reads it, for torchtitan TORCHTITAN_RELEASE (planner/train_engines.py).

Every section and key written is a field of the release's JobConfig dataclasses
(torchtitan/config/job_config.py@v0.2.2; config/manager.py rejects unknown keys), recorded in
tests/engine_flags/torchtitan-v0.2.2.json by tools/torchtitan_fields.py. The mapping:
- degrees: train_engines.torchtitan_degrees (dp_replicate * dp_shard * cp * tp * pp = GPUs);
- batch: torchtitan's batch degree is dp_replicate * dp_shard (= our dp). Without PP a
  DP rank runs local_batch_size = b per forward-backward and accumulates
  global_batch_size / (b * dp) = m of them (torchtitan/train.py, gradient_accumulation_steps);
  with PP it hands local_batch_size = m * b to the schedule, which cuts it into micro-batches of
  pipeline_parallel_microbatch_size = b (distributed/pipeline_parallel.py);
- stages: even stages as pipeline_parallel_layers_per_stage = L / (p * v) with the embedding
  and head weighed as no layer (first/last_stage_less_layers = 0), so the stages are exactly
  the planned ones; an uneven split as module_fqns_per_model_part, one module list per model
  part (p * v of them when interleaved, stage_modules);
- recompute -> [activation_checkpoint] mode (selective as per-op SAC, "op"; full of every N-th
  block as layer SAC, selective_ac_option "N");
- --precision fp8 --fp8-recipe tensorwise (torchtitan's default) -> converters =
  ["quantize.linear.float8"] with recipe_name = "tensorwise" (torchao's dynamic tensor-wise
  scaling, the LM head left in bf16: filter_fqns = ["output"]); --fp8-recipe mxfp8 ->
  converters = ["quantize.linear.mx"] with recipe_name = "mxfp8_cublas" (MXLinear's default,
  torchao's 1x32-block MXFP8 on cuBLAS; SM100 asserted) and filter_fqns = ["output"];
  delayed scaling has no torchtitan form (train_engines.check_request refuses it); with either,
  [compile] enable = true: torchtitan's docs call torch.compile "required for competitive
  performance" with fp8 (docs/float8.md and docs/mxfp8.md at v0.2.2: it fuses the scaling and
  casting kernels), and the plan prices the casts fused;
- MoE: expert_parallel_degree = ep with expert_tensor_parallel_degree = 1 (train_engines:
  EP takes all of TP and part of the CP ranks and data-parallel shard), the standard NCCL all-to-all; with fp8
  the experts' grouped GEMMs convert too (FP8_GROUPED_CONVERTERS) and the router's gate stays
  16-bit;
- CP: nothing beyond the degree; training runs torch's default KV all-gather (the
  rotate-method key reaches only the validator), and the estimate prices that.
Data, tokenizer, optimizer and checkpoint settings are the user's to add.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from planner.cost import stage_split as split
from planner.emit.command import (
    ALL_NODES,
    HEAD_ADDRESS_PLACEHOLDER,
    ConfigFile,
    LaunchStep,
    NodeSet,
)
from planner.emit.torchrun import torchrun_flags
from planner.requests import FP8_RECIPE_DEFAULTS
from planner.train_engines import (
    TORCHTITAN_AC_MODES,
    TORCHTITAN_IMPLEMENTED,
    TORCHTITAN_RELEASE,
    TORCHTITAN_SCHEDULES,
    torchtitan_degrees,
    torchtitan_model,
)

if TYPE_CHECKING:
    from planner.layout import TrainConfig
    from planner.specs import ClusterSpec, ModelSpec

CONFIG_PATH = "torchtitan-plan.toml"
ENTRY_MODULE = "torchtitan.train"
"""run_train.sh@v0.2.2: TRAIN_FILE defaults to torchtitan.train, run as `-m`."""
RENDEZVOUS_PORT = 29500
RENDEZVOUS_ID = "plan-train"
FLOAT8_CONVERTER = "quantize.linear.float8"
"""register_model_converter name (components/quantization/float8.py@v0.2.2)."""
MX_CONVERTER = "quantize.linear.mx"
"""register_model_converter name (components/quantization/mx.py@v0.2.2)."""
FP8_CONVERTERS = {
    "tensorwise": (FLOAT8_CONVERTER, {"recipe_name": "tensorwise", "filter_fqns": ["output"]}),
    "mxfp8": (MX_CONVERTER, {"recipe_name": "mxfp8_cublas", "filter_fqns": ["output"]}),
}
"""--fp8-recipe -> (converter, its [quantize.linear.*] keys): Float8Linear.recipe_name is
Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"] | None, MXLinear.recipe_name a torchao
MX recipe name defaulting to "mxfp8_cublas" (config/job_config.py@v0.2.2)."""
FLOAT8_GROUPED_CONVERTER = "quantize.grouped_mm.float8"
"""register_model_converter name (components/quantization/float8.py@v0.2.2)."""
MX_GROUPED_CONVERTER = "quantize.grouped_mm.mx"
"""register_model_converter name (components/quantization/mx.py@v0.2.2)."""
FP8_GROUPED_CONVERTERS = {
    "tensorwise": (FLOAT8_GROUPED_CONVERTER, {"fqns": ["experts"]}),
    "mxfp8": (MX_GROUPED_CONVERTER, {"recipe_name": "mxfp8", "fqns": ["experts"]}),
}
"""MoE: the routed experts' grouped GEMMs in fp8 too, as the plan prices them
(register_model_converter names in components/quantization/float8.py and mx.py@v0.2.2; the
models' example TOMLs name fqns = ["experts"]); the router's gate stays 16-bit, as those TOMLs
filter it (ROUTER_GATE)."""
ROUTER_GATE = "router.gate"
"""The MoE router's linear, left 16-bit (the models' example TOMLs filter it from float8)."""


def toml_value(value: object) -> str:
    """A TOML literal for the few value types the job config uses."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise AssertionError(f"no TOML form for {value!r}")


def job_sections(model: ModelSpec, config: TrainConfig, global_batch: int,
                 seq_len: int) -> dict[str, dict[str, object]]:
    """Section -> key -> value of the job config (the keys tests check against the release)."""
    c = config
    known = torchtitan_model(model)
    model_keys: dict[str, object] = {} if known is None else {"name": known[0], "flavor": known[1]}
    recipe = c.fp8_recipe or FP8_RECIPE_DEFAULTS["torchtitan"]
    if c.precision == "fp8":
        model_keys["converters"] = [FP8_CONVERTERS[recipe][0]] + (
            [FP8_GROUPED_CONVERTERS[recipe][0]] if model.is_moe else [])
    m = global_batch // (c.micro_batch_size * c.dp)
    local = c.micro_batch_size * m if c.pp > 1 else c.micro_batch_size
    sections: dict[str, dict[str, object]] = {
        "model": model_keys,
        "training": {"local_batch_size": local, "global_batch_size": global_batch, "seq_len": seq_len},
        "parallelism": {**torchtitan_degrees(c), **pipeline_keys(model, c), **context_keys(c)},
        "activation_checkpoint": {"mode": TORCHTITAN_AC_MODES[c.recompute]},
    }
    if c.recompute in ("op", "selective"):
        sections["activation_checkpoint"]["selective_ac_option"] = "op"
    if c.recompute == "full" and c.recompute_every is not None:
        # layer-level selective checkpointing: every N-th block whole (activation_checkpoint.py
        # v0.2.2 `_apply_layer_sac`, selective_ac_option a digit string)
        sections["activation_checkpoint"] = {"mode": "selective", "selective_ac_option": str(c.recompute_every)}
    if c.precision == "fp8":
        sections["compile"] = {"enable": True}
        converter, keys = FP8_CONVERTERS[recipe]
        sections[converter] = dict(keys)
        if model.is_moe:
            sections[converter]["filter_fqns"] = [*keys["filter_fqns"], ROUTER_GATE]
            grouped, grouped_keys = FP8_GROUPED_CONVERTERS[recipe]
            sections[grouped] = dict(grouped_keys)
    return sections


def pipeline_keys(model: ModelSpec, config: TrainConfig) -> dict[str, object]:
    c = config
    if c.pp == 1:
        return {}
    keys: dict[str, object] = {"pipeline_parallel_schedule": TORCHTITAN_SCHEDULES[c.schedule],
                               "pipeline_parallel_microbatch_size": c.micro_batch_size}
    even = c.first_last_layers is None and not split.needs_layout(
        split.layers_per_stage(model.num_hidden_layers, c.pp, None), c.virtual_stages)
    if even:
        keys["pipeline_parallel_layers_per_stage"] = model.num_hidden_layers // (c.pp * c.virtual_stages)
        keys["pipeline_parallel_first_stage_less_layers"] = 0
        keys["pipeline_parallel_last_stage_less_layers"] = 0
    else:
        keys["module_fqns_per_model_part"] = stage_modules(model.num_hidden_layers, c.pp, c.first_last_layers,
                                                           c.virtual_stages)
    return keys


def stage_modules(num_layers: int, pp: int, first_last: tuple[int, int] | None, v: int = 1) -> list[list[str]]:
    """Module names per model part for an uneven split (`first_last` None: even stages whose
    layers v does not divide, 80 on 4 stages at v = 3 in chunks of 7, 7, 6): pp * v parts, part k chunk k // pp of
    stage k % pp (torchtitan's "loop" stage ids, as Megatron's layout string orders its chunks,
    stage_split.megatron_layout), each stage's layers spread over its chunks as evenly as
    possible (stage_split.chunk_layers), the layers consecutive in part order; the embedding
    opens the first part, the final norm and the head close the last. v = 1: first F layers, the
    middle ones even, the last L_l."""
    layers = split.layers_per_stage(num_layers, pp, first_last)
    chunks = [split.chunk_layers(n, v) for n in layers]
    counts = [chunks[k % pp][k // pp] for k in range(pp * v)]
    parts, start = [], 0
    for part, count in enumerate(counts):
        names = [f"layers.{i}" for i in range(start, start + count)]
        start += count
        if part == 0:
            names.insert(0, "tok_embeddings")
        if part == len(counts) - 1:
            names += ["norm", "output"]
        parts.append(names)
    return parts


def context_keys(config: TrainConfig) -> dict[str, object]:
    """None: the training step shards with prepare_context_parallel_input and keeps torch's
    default KV rotation, an all-gather (context_parallel_rotate_method is read only by the
    validator, components/validate.py@v0.2.2); the estimate prices that all-gather."""
    return {}


def render_toml(model: ModelSpec, sections: dict[str, dict[str, object]], config: TrainConfig,
                num_gpus: int) -> str:
    c = config
    lines = [f"# torchtitan {TORCHTITAN_RELEASE} job config for {model.name}, planned by `plan`: "
             f"tp={c.tp} cp={c.cp} pp={c.pp} dp={c.dp} on {num_gpus} GPUs",
             f"# (keys: torchtitan/config/job_config.py@{TORCHTITAN_RELEASE}). Add [training] dataset, "
             "[model] hf_assets_path, [optimizer] and [checkpoint] settings."]
    for section, keys in sections.items():
        lines += ["", f"[{section}]"]
        if section == "model" and "name" not in keys:
            lines.append(f"# torchtitan {TORCHTITAN_RELEASE} has no model or flavor for {model.name} (it implements "
                         f"{', '.join(TORCHTITAN_IMPLEMENTED)}): add one under torchtitan/models/ with these widths, "
                         f"then set name and flavor")
        lines += [f"{key} = {toml_value(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def torchtitan_steps(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig,
                     global_batch: int, seq_len: int) -> tuple[LaunchStep, ...]:
    """One step, run on every node: the job config written to CONFIG_PATH and torchrun
    (c10d rendezvous, the same line on every node) running torchtitan.train with it."""
    num_gpus = config.layout.num_gpus
    num_nodes = math.ceil(num_gpus / cluster.gpus_per_node)
    endpoint = None if num_nodes == 1 else f"{HEAD_ADDRESS_PLACEHOLDER}:{RENDEZVOUS_PORT}"
    argv = ["torchrun", *torchrun_flags(min(num_gpus, cluster.gpus_per_node), num_nodes,
                                        rdzv_endpoint=endpoint, rdzv_id=RENDEZVOUS_ID),
            "-m", ENTRY_MODULE, "--job.config_file", CONFIG_PATH]
    text = render_toml(model, job_sections(model, config, global_batch, seq_len), config, num_gpus)
    return (LaunchStep(ALL_NODES, NodeSet(0, num_nodes), tuple(argv), (ConfigFile(CONFIG_PATH, text),)),)
