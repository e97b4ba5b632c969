"""Megatron-LM launch command for a training configuration (argv lists).

Targets Megatron-LM core_r0.14 and later (pretrain_gpt.py, flag names as defined in
megatron/training/arguments.py at core_r0.14.0; Megatron-FSDP flags for ZeRO-2/3 from the Megatron-Core
developer guide, "Megatron FSDP").

Uneven pipeline stages (p does not divide L): --decoder-first-pipeline-num-layers F and
--decoder-last-pipeline-num-layers L_l (megatron/training/arguments.py, core_r0.10+, mapped
to TransformerConfig.num_layers_in_first/last_pipeline_stage; its __post_init__ requires
each > 0, the middle layers divisible by the p - 2 middle stages, and with virtual stages
F, L_l and the per-rank middle layers divisible by v). Interleaving with an uneven split
must name the chunk count, --num-virtual-stages-per-pipeline-rank v: arguments.py asserts
"please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline parallel
degree when enable uneven pipeline parallelism" when --num-layers-per-virtual-pipeline-stage
is given instead. torchrun with the c10d rendezvous (planner/emit/torchrun.py): the same
command on every node (node order follows arrival), so one step serves them all.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from planner.emit.command import ALL_NODES, HEAD_ADDRESS_PLACEHOLDER, LaunchStep, NodeSet
from planner.emit.torchrun import torchrun_flags

if TYPE_CHECKING:  # `plan --help` imports the emitter registry, not the specs (pydantic)
    from planner.layout import TrainConfig
    from planner.specs import ClusterSpec, ModelSpec

MEGATRON_VERSION = "core_r0.14"
RENDEZVOUS_PORT = 29500
TRAIN_SCRIPT = "pretrain_gpt.py"
RENDEZVOUS_ID = "plan-train"
ZERO_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


def torchrun_argv(num_gpus: int, cluster: ClusterSpec) -> list[str]:
    num_nodes = math.ceil(num_gpus / cluster.gpus_per_node)
    endpoint = None if num_nodes == 1 else f"{HEAD_ADDRESS_PLACEHOLDER}:{RENDEZVOUS_PORT}"
    return ["torchrun", *torchrun_flags(min(num_gpus, cluster.gpus_per_node), num_nodes,
                                        rdzv_endpoint=endpoint, rdzv_id=RENDEZVOUS_ID)]


def model_args(model: ModelSpec, seq_len: int) -> list[str]:
    args = ["--num-layers", str(model.num_hidden_layers), "--hidden-size", str(model.hidden_size),
            "--ffn-hidden-size", str(model.intermediate_size),
            "--num-attention-heads", str(model.num_attention_heads),
            "--seq-length", str(seq_len),
            "--max-position-embeddings", str(max(seq_len, model.max_position_embeddings))]
    if model.num_key_value_heads != model.num_attention_heads:
        args += ["--group-query-attention", "--num-query-groups", str(model.num_key_value_heads)]
    if model.gated_mlp:
        args.append("--swiglu")
    if model.norm_type == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if model.position_embedding == "rope":
        args += ["--position-embedding-type", "rope"]
    if not (model.attention_bias or model.mlp_bias):
        args.append("--disable-bias-linear")
    if not model.tie_word_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    args.append("--bf16" if model.dtype == "bfloat16" else "--fp16" if model.dtype == "float16" else "--fp32")
    return args


def parallel_args(model: ModelSpec, config: TrainConfig, global_batch: int) -> list[str]:
    c = config
    args = ["--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.pp)]
    if c.first_last_layers is not None:
        first, last = c.first_last_layers
        args += ["--decoder-first-pipeline-num-layers", str(first),
                 "--decoder-last-pipeline-num-layers", str(last)]
        if c.schedule == "interleaved":
            args += ["--num-virtual-stages-per-pipeline-rank", str(c.virtual_stages)]
    elif c.schedule == "interleaved":
        layers = model.num_hidden_layers // c.pp // c.virtual_stages
        args += ["--num-layers-per-virtual-pipeline-stage", str(layers)]
    if c.sequence_parallel:
        args.append("--sequence-parallel")
    args += ["--micro-batch-size", str(c.micro_batch_size), "--global-batch-size", str(global_batch)]
    if c.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"]
    elif c.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    # AttnBackend (megatron/core/transformer/enums.py, core_v0.14.0): flash, or TE's unfused
    # kernel, which materializes the scores as the 2021-22 code did.
    args += ["--attention-backend", "flash" if c.attention == "flash" else "unfused"]
    if c.zero_stage >= 1:
        args.append("--use-distributed-optimizer")
    if c.zero_stage >= 2:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", ZERO_SHARDING[c.zero_stage],
                 "--no-gradient-accumulation-fusion"]
    if c.dp > 1:
        args.append("--overlap-grad-reduce")
    return args


def megatron_steps(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig,
                   global_batch: int, seq_len: int) -> tuple[LaunchStep, ...]:
    """One step, run on every node: torchrun + pretrain_gpt.py + the layout's arguments.
    GPipe has no Megatron flag (Megatron runs 1F1B); data, tokenizer and optimizer
    hyper-parameters are the user's to add."""
    num_gpus = config.tp * config.pp * config.dp
    num_nodes = math.ceil(num_gpus / cluster.gpus_per_node)
    argv = (torchrun_argv(num_gpus, cluster) + [TRAIN_SCRIPT] + parallel_args(model, config, global_batch)
            + model_args(model, seq_len))
    return (LaunchStep(ALL_NODES, NodeSet(0, num_nodes), tuple(argv)),)
