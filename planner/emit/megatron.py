"""Megatron-LM launch command for a training configuration (argv lists), for the release in
TrainConfig's request (planner/engines.py; flag names as megatron/training/arguments.py defines
them at that tag, tests/engine_flags/megatron-TAG.json).

The model that was planned is the model that is built: every architecture field of the spec has
its flag (GQA groups, head dim, SwiGLU, norm, RoPE and its base, biases, tied embeddings, MoE
experts and top-k, no dropout), and `--make-vocab-size-divisible-by` is chosen so that Megatron
does not pad the vocabulary beyond the spec's (megatron/training/tokenizer: the vocabulary is
padded to a multiple of that value times TP).

Startup checks the command satisfies (arguments.py validate_args, transformer_config.py):
TP > 1 before Blackwell needs CUDA_DEVICE_MAX_CONNECTIONS=1 in the environment (set here with
`env`); Megatron-FSDP (ZeRO-2/3, `--use-megatron-fsdp`) needs `--ckpt-format fsdp_dtensor` and
that variable not set to 1 (so FSDP commands leave it unset); num_query_groups must be a multiple
of TP before core_v0.16.0 (a multiple or a divisor from then on): `refusals` says which layouts
the chosen release refuses, and the CLI moves them to the rejected list.

Uneven pipeline stages (p does not divide L): --decoder-first-pipeline-num-layers F and
--decoder-last-pipeline-num-layers L_l (megatron/training/arguments.py, core_r0.10+, mapped
to TransformerConfig.num_layers_in_first/last_pipeline_stage; its __post_init__ requires
each > 0, the middle layers divisible by the p - 2 middle stages, and with virtual stages
F, L_l and the per-rank middle layers divisible by v). Interleaving with an uneven split
must name the chunk count, --num-virtual-stages-per-pipeline-rank v: arguments.py asserts
"please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline parallel
degree when enable uneven pipeline parallelism" when --num-layers-per-virtual-pipeline-stage
is given instead. The third split, the embedding and the loss counted as one layer each
(--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split; TransformerConfig
fields at core_v0.14.0 and core_v0.19.0, get_num_layers_to_build in
megatron/core/transformer/transformer_block.py): L + 2 units even over p*v chunks, never with the
first/last flags (__post_init__ raises); interleaving names v with
--num-virtual-stages-per-pipeline-rank (validate_args then needs p*v to divide L + 2, the
per-chunk count being implied). The fourth, where neither splits the layers for an interleaved
schedule: --pipeline-model-parallel-layout naming every chunk's layers (E, t..., L; chunk j of
rank i at entry j*p + i, megatron/core/transformer/pipeline_parallel_layer_layout.py), alone:
validate_args refuses it with the virtual-stage flags, and it replaces the first/last ones.
MoE with --overlap-moe-expert-parallel-comm: EP, the alltoall dispatcher, no full recompute,
a virtual pipeline when pp > 1, bf16 or fp16 (TransformerConfig.__post_init__). Megatron's
default precision is fp32 (there is no --fp32); the plan prices 16-bit mixed precision, so every
command says --bf16, or --fp16 for a float16 checkpoint (params.training_dtype).
torchrun with the c10d rendezvous (planner/emit/torchrun.py): the same
command on every node (node order follows arrival), so one step serves them all.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from planner.cost import efficiency
from planner.cost import stage_split as split
from planner.cost.activations import outputs_recompute_modules
from planner.cost.params import training_dtype
from planner.cost.pipeline import microbatch_group_size
from planner.emit.command import (
    ALL_NODES,
    HEAD_ADDRESS_PLACEHOLDER,
    LaunchStep,
    NodeSet,
    env_prefix,
)
from planner.emit.torchrun import torchrun_flags
from planner.engines import DEFAULT_MEGATRON, MEGATRON_RELEASES
from planner.requests import FP8_RECIPE_DEFAULTS

if TYPE_CHECKING:  # `plan --help` imports the emitter registry, not the specs (yaml, the schemas)
    from planner.engines import MegatronRelease
    from planner.layout import TrainConfig
    from planner.specs import ClusterSpec, ModelSpec

RENDEZVOUS_PORT = 29500
TRAIN_SCRIPT = "pretrain_gpt.py"
RENDEZVOUS_ID = "plan-train"
ZERO_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
FSDP_CHECKPOINT_FORMAT = "fsdp_dtensor"
MAX_VOCAB_DIVISOR = 128
"""Megatron's default --make-vocab-size-divisible-by."""


def torchrun_argv(num_gpus: int, cluster: ClusterSpec) -> list[str]:
    num_nodes = math.ceil(num_gpus / cluster.gpus_per_node)
    endpoint = None if num_nodes == 1 else f"{HEAD_ADDRESS_PLACEHOLDER}:{RENDEZVOUS_PORT}"
    return ["torchrun", *torchrun_flags(min(num_gpus, cluster.gpus_per_node), num_nodes,
                                        rdzv_endpoint=endpoint, rdzv_id=RENDEZVOUS_ID)]


def model_args(model: ModelSpec, seq_len: int, tp: int) -> list[str]:
    args = ["--num-layers", str(model.num_hidden_layers), "--hidden-size", str(model.hidden_size),
            "--ffn-hidden-size", str(model.intermediate_size),
            "--num-attention-heads", str(model.num_attention_heads),
            "--seq-length", str(seq_len),
            "--max-position-embeddings", str(max(seq_len, model.max_position_embeddings))]
    if model.is_mla:
        args += mla_args(model)
    else:
        if model.num_key_value_heads != model.num_attention_heads:
            args += ["--group-query-attention", "--num-query-groups", str(model.num_key_value_heads)]
        if model.head_dim * model.num_attention_heads != model.hidden_size:
            args += ["--kv-channels", str(model.head_dim)]
    if model.gated_mlp:
        args.append("--swiglu")
    elif model.mlp_activation == "squared_relu":  # model_refusals: the only other activation emitted
        args.append("--squared-relu")
    if model.norm_type == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    elif model.layernorm_1p:  # Nemotron's LayerNorm1P (arguments.py at core_v0.14.0 and core_v0.19.0)
        args.append("--apply-layernorm-1p")
    if model.position_embedding == "rope":
        args += ["--position-embedding-type", "rope", "--rotary-base", f"{model.rope_theta:.0f}"]
        if model.partial_rotary_factor < 1:  # Nemotron's half-rotated heads
            args += ["--rotary-percent", f"{model.partial_rotary_factor:g}"]
        if model.llama3_rope_scaling_factor is not None:  # Llama 3.1's scaling (arguments.py at core_v0.14/19)
            args += ["--use-rope-scaling", "--rope-scaling-factor", f"{model.llama3_rope_scaling_factor:g}"]
    if model.qk_norm and not model.is_mla:  # MLA: mla_args
        args.append("--qk-layernorm")  # --normalization RMSNorm makes it an RMSNorm per head
    if not (model.attention_bias or model.mlp_bias):
        args.append("--disable-bias-linear")
    if model.qkv_bias and not model.attention_bias:
        args.append("--add-qkv-bias")
    if not model.tie_word_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if model.num_mtp_layers:  # on the last stage (train.trained_model; the loss weight stays Megatron's 0.1)
        args += ["--mtp-num-layers", str(model.num_mtp_layers)]
    args += moe_args(model)
    args += ["--make-vocab-size-divisible-by", str(vocab_divisor(model.vocab_size, tp)),
             "--attention-dropout", "0", "--hidden-dropout", "0"]
    # the plan's mixed precision (params.training_dtype): Megatron's default, without either, is fp32
    args.append("--fp16" if training_dtype(model) == "float16" else "--bf16")
    return args


def mla_args(model: ModelSpec) -> list[str]:
    """Multi-latent attention (MLASelfAttention, megatron/core/transformer/multi_latent_attention.py;
    flags in megatron/training/arguments.py at core_v0.19.0): the latent ranks and per-head dims
    of the spec. A spec with a DSA indexer gets no command (refusals())."""
    args = ["--multi-latent-attention", "--kv-lora-rank", str(model.kv_lora_rank),
            "--qk-head-dim", str(model.qk_nope_head_dim), "--qk-pos-emb-head-dim", str(model.qk_rope_head_dim),
            "--v-head-dim", str(model.v_head_dim)]
    if model.q_lora_rank:
        args += ["--q-lora-rank", str(model.q_lora_rank)]
    # the RMSNorms on the query and KV latents (DeepSeek-V2/V3's q_a_layernorm, kv_a_layernorm):
    # Megatron builds them only with --qk-layernorm (gpt_layer_specs.py, MLA's up-projections
    # as layer-norm linears, core_v0.14.0 and core_v0.19.0)
    args.append("--qk-layernorm")
    return args


def moe_args(model: ModelSpec) -> list[str]:
    """Experts, top-k and each expert's FFN size; group-limited routing (--moe-router-num-groups,
    --moe-router-group-topk) where the spec has it; shared experts as one MLP of their summed size
    (Megatron's SharedExpertMLP); the dense layers where the spec places them
    (dense_layer_indices; first where it has only their count) as --moe-layer-freq's list
    (moe_layer_freq_pattern)."""
    if not model.is_moe:
        return []
    args = ["--num-experts", str(model.num_local_experts), "--moe-router-topk", str(model.num_experts_per_tok),
            "--moe-ffn-hidden-size", str(model.expert_intermediate_size)]
    if model.num_shared_experts:
        shared = model.shared_expert_intermediate_size or model.expert_intermediate_size
        args += ["--moe-shared-expert-intermediate-size", str(model.num_shared_experts * shared)]
    if model.num_dense_layers:
        args += ["--moe-layer-freq", moe_layer_freq_pattern(model)]
    if model.num_expert_groups:
        # group-limited routing (moe_utils.group_limited_topk: each token's top-k from its best
        # groups, scored by the sum of their top-(k/groups) scores; DeepSeek-V3's top-2 of 8/4)
        args += ["--moe-router-num-groups", str(model.num_expert_groups),
                 "--moe-router-group-topk", str(model.expert_groups_per_token)]
    return args + router_args(model)


def moe_layer_freq_pattern(model: ModelSpec) -> str:
    """--moe-layer-freq as the list expression Megatron evaluates (arguments.py moe_freq_type and
    _eval_pattern at core_v0.19.0: digits, commas, brackets, parentheses, + and * only; 1 an MoE
    layer, 0 a dense one, one entry per layer): the shortest unit the layers repeat, written as
    runs, times its repeats. DeepSeek-V3 (dense 0-2 of 61): ([0]*3+[1]*58); Llama-4 Maverick
    (every other layer dense from 0, 48 layers): ([0]+[1])*24."""
    dense = set(range(model.num_dense_layers) if model.dense_layer_indices is None else model.dense_layer_indices)
    flags = [0 if i in dense else 1 for i in range(model.num_hidden_layers)]
    num_layers = len(flags)
    period = next(n for n in range(1, num_layers + 1)
                  if num_layers % n == 0 and flags == flags[:n] * (num_layers // n))
    runs: list[list[int]] = []
    for flag in flags[:period]:
        if runs and runs[-1][0] == flag:
            runs[-1][1] += 1
        else:
            runs.append([flag, 1])
    unit = "+".join(f"[{flag}]" + (f"*{count}" if count > 1 else "") for flag, count in runs)
    repeats = num_layers // period
    return f"({unit})" + (f"*{repeats}" if repeats > 1 else "")


def router_args(model: ModelSpec) -> list[str]:
    """The router the model was trained with (ModelSpec.router_*), in Megatron-Core's terms
    (moe_utils.topk_routing_with_score_function and TransformerConfig, core_v0.14.0 and
    core_v0.19.0): softmax after the top-k is Megatron's default and renormalizes the chosen
    experts' weights; a softmax over every expert first (no renormalization: DeepSeek-V2,
    Qwen2-MoE; or one expert, whose softmax after the top-k has no gradient, which
    __post_init__ refuses) is --moe-router-pre-softmax; sigmoid and sqrtsoftplus scores are
    renormalized over the top-k when k > 1 (router_refusals where a model does not);
    DeepSeek-V3's expert bias, its 2.5 weight scale and Llama 4's scaling of the expert input
    each have their flag (Megatron-Bridge's DeepSeek-V3 bridge sets the same router at 067f987)."""
    if not model.is_moe:
        return []
    args = []
    if model.router_score_function == "softmax":
        if not model.router_topk_normalized or model.num_experts_per_tok == 1:
            args.append("--moe-router-pre-softmax")
    else:
        args += ["--moe-router-score-function", model.router_score_function]
    if model.router_expert_bias:
        args.append("--moe-router-enable-expert-bias")
    if model.router_topk_scaling_factor is not None:
        args += ["--moe-router-topk-scaling-factor", f"{model.router_topk_scaling_factor:g}"]
    if model.router_probs_on_input:
        args.append("--moe-apply-probs-on-input")
    return args


def router_refusals(model: ModelSpec, release: MegatronRelease) -> list[str]:
    """Routers no flag of this release builds (router_args)."""
    if not model.is_moe:
        return []
    score = model.router_score_function
    if score == "sqrtsoftplus" and not release.sqrtsoftplus_router:
        return [f"Megatron-LM {release.version}'s router has no sqrtsoftplus scores (softmax or sigmoid; "
                "core_v0.19.0 has them), so the command would train another router"]
    if score != "softmax" and not model.router_topk_normalized and model.num_experts_per_tok > 1:
        return [f"Megatron-LM {release.version} renormalizes {score} router weights over the top-k; this "
                "model does not (norm_topk_prob false), so the command would train another router"]
    if model.router_expert_bias and score == "softmax":
        return [f"Megatron-LM {release.version} adds an expert bias only to sigmoid scores; this model's router "
                "is a softmax with one, so the command would train another router"]
    return []


def vocab_divisor(vocab_size: int, tp: int) -> int:
    """The largest power of two up to 128 with vocab_size divisible by it times tp: Megatron then
    keeps the spec's vocabulary as it is (1 when tp does not divide it: some padding is unavoidable)."""
    divisor = MAX_VOCAB_DIVISOR
    while divisor > 1 and vocab_size % (divisor * tp):
        divisor //= 2
    return divisor


MOE_OVERLAP_DEVICE_CONNECTIONS = "32"
"""CUDA_DEVICE_MAX_CONNECTIONS under --overlap-moe-expert-parallel-comm: the MoE README
(megatron/core/transformer/moe/README.md, core_v0.19.0) requires more than 1 for the EP
all-to-all overlap, and validate_args names 32 (arguments.py, core_v0.14.0 and core_v0.19.0)."""


def launch_env(config: TrainConfig) -> tuple[str, ...]:
    """CUDA_DEVICE_MAX_CONNECTIONS=1 for TP > 1 or CP > 1 (validate_args asserts it before
    Blackwell for either, and it orders their communication ahead of compute); Megatron-FSDP
    asserts it is not 1, so FSDP gets none. Under Megatron's combined 1F1B
    (--overlap-moe-expert-parallel-comm) 32 (MOE_OVERLAP_DEVICE_CONNECTIONS), with TP or CP too:
    validate_args then only warns ("1 or 32, which depends on which parallelization you want to
    prioritize") and the plan prices the EP overlap, so it prioritizes that."""
    if config.moe_comm_overlap:
        return env_prefix(CUDA_DEVICE_MAX_CONNECTIONS=MOE_OVERLAP_DEVICE_CONNECTIONS)
    if (config.tp > 1 or config.cp > 1) and config.zero_stage < 2:
        return env_prefix(CUDA_DEVICE_MAX_CONNECTIONS="1")
    return ()


def refusals(model: ModelSpec, config: TrainConfig, release: MegatronRelease) -> list[str]:
    """Why this release refuses the configuration at startup (TransformerConfig.__post_init__),
    or why the emitted command would build another model than the one planned
    (model_refusals)."""
    wrong_model = model_refusals(model, release)
    if wrong_model:
        return wrong_model
    groups = model.num_key_value_heads
    if groups % config.tp and not release.tp_may_exceed_query_groups:
        return [f"Megatron-LM {release.version} needs num_query_groups {groups} divisible by tp={config.tp} "
                "(a divisor of tp is accepted from core_v0.16.0)"]
    return []


def model_refusals(model: ModelSpec, release: MegatronRelease) -> list[str]:
    """Why no command of this release builds the planned model, whatever the configuration: the
    plan stands, its launch is not emitted."""
    if model.index_n_heads:
        return [f"Megatron-LM {release.version}: the command cannot express the DSA lightning indexer "
                "(DeepSeek-V3.2, GLM-5) yet, so it would train another model"]
    if model.global_head_dim or model.num_global_key_value_heads or model.attention_k_eq_v:
        return [f"Megatron-LM {release.version}: the command cannot give global-attention layers their own "
                "head dim, KV heads or shared K/V projection (Gemma 4, MiMo-V2), so it would train another "
                "model"]
    if model.qk_norm_across_heads:
        return [f"Megatron-LM {release.version}: --qk-layernorm normalizes each head's query and key; this "
                "model's norms span every head at once (MiniMax-M2's qk_norm_type per_layer), so the command "
                "would train another model"]
    if model.v_head_dim not in (None, model.head_dim) and not model.is_mla:
        return [f"Megatron-LM {release.version}: --kv-channels gives queries, keys and values one head dim; "
                f"this model's values have {model.v_head_dim} beside {model.head_dim}, so the command would "
                "train another model"]
    if model.sliding_window is not None:
        return [f"Megatron-LM {release.version}: the command gives every layer full attention; this model's "
                f"{model.num_sliding_window_layers or model.num_hidden_layers} sliding-window layers "
                f"({model.sliding_window} tokens), which the plan prices as windows, are not emitted, so it would "
                "train another model (Megatron has --window-size and --window-attn-skip-freq; the planner does "
                "not write them yet)"]
    if model.attention_chunk_size is not None:
        return [f"Megatron-LM {release.version}: the command cannot give this model's RoPE layers attention "
                f"in {model.attention_chunk_size:,}-token chunks beside full-attention NoPE layers (Llama 4's "
                "iRoPE), so it would train another model; torchtitan builds it (--engine torchtitan)"]
    if model.num_recurrent_layers:
        return [f"Megatron-LM {release.version}: pretrain_gpt.py builds attention blocks only; the "
                f"{model.recurrent_kind} layers of this hybrid need pretrain_mamba.py's hybrid layer pattern, "
                "which the planner does not emit yet, so it would train another model"]
    usual = ("silu",) if model.gated_mlp else ("gelu", "squared_relu")
    if model.mlp_activation not in (None, *usual):
        kind = "gated " if model.gated_mlp else ""
        return [f"Megatron-LM {release.version}: the command builds SwiGLU (--swiglu), GELU or squared-ReLU "
                f"(--squared-relu) MLPs; this model's {kind}{model.mlp_activation} MLP is none of them, so it would "
                "train another model"]
    router = router_refusals(model, release)
    if router:
        return router
    if model.num_mlp_only_layers or model.num_mixer_only_layers:
        return [f"Megatron-LM {release.version}: pretrain_gpt.py gives every layer attention and an MLP of one "
                "width; this model's blocks differ per layer (MLP-only or mixer-only blocks, Nemotron-NAS / "
                "hybrid patterns), so it would train another model"]
    return []


def parallel_args(model: ModelSpec, config: TrainConfig, global_batch: int,
                  release: MegatronRelease | None = None) -> list[str]:
    c = config
    args = ["--tensor-model-parallel-size", str(c.tp), "--pipeline-model-parallel-size", str(c.pp)]
    args += context_parallel_args(c)
    layers = (None if c.schedule != "interleaved" or c.account_for_embedding_and_loss
              else split.layers_per_stage(model.num_hidden_layers, c.pp, c.first_last_layers))
    if layers is not None and split.needs_layout(layers, c.virtual_stages):
        # a stage's layers not a multiple of its chunks: every chunk named (stage_split.megatron_layout)
        args += ["--pipeline-model-parallel-layout", split.megatron_layout(layers, c.virtual_stages,
                                                                           model.num_mtp_layers)]
    elif c.first_last_layers is not None:
        first, last = c.first_last_layers
        args += ["--decoder-first-pipeline-num-layers", str(first),
                 "--decoder-last-pipeline-num-layers", str(last)]
        if c.schedule == "interleaved":
            args += ["--num-virtual-stages-per-pipeline-rank", str(c.virtual_stages)]
    elif c.account_for_embedding_and_loss:
        args += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
        if c.schedule == "interleaved":
            args += ["--num-virtual-stages-per-pipeline-rank", str(c.virtual_stages)]
    elif c.schedule == "interleaved":
        layers = model.num_hidden_layers // c.pp // c.virtual_stages
        args += ["--num-layers-per-virtual-pipeline-stage", str(layers)]
    if c.schedule == "interleaved":
        # p not dividing m: the micro-batch groups Megatron then needs (default p)
        group = microbatch_group_size(c.pp, global_batch // (c.micro_batch_size * c.dp))
        if group is not None and group != c.pp:
            args += ["--microbatch-group-size-per-virtual-pipeline-stage", str(group)]
    args += expert_parallel_args(model, c, release)
    if c.sequence_parallel:
        args.append("--sequence-parallel")
    args += ["--micro-batch-size", str(c.micro_batch_size), "--global-batch-size", str(global_batch)]
    if c.recompute == "full" and c.recompute_num_layers is not None:  # the first k layers of each chunk
        args += ["--recompute-granularity", "full", "--recompute-method", "block",
                 "--recompute-num-layers", str(c.recompute_num_layers)]
    elif c.recompute == "full":
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"]
    elif c.recompute == "selective":
        args += ["--recompute-granularity", "selective"]
    elif c.recompute == "outputs":  # output-discarding checkpoints (TransformerConfig.recompute_modules)
        args += ["--recompute-granularity", "selective", "--recompute-modules",
                 *outputs_recompute_modules(model, c.fp8_delayed)]
    args += attention_args(c)
    if c.precision == "fp8":
        args += fp8_args(c.fp8_recipe or FP8_RECIPE_DEFAULTS["megatron"])
    if c.tp_comm_overlap:
        args.append("--tp-comm-overlap")  # needs --sequence-parallel (arguments.py)
    if c.moe_comm_overlap:  # combined 1F1B: EP, no full recompute, interleaved when pp > 1
        args.append("--overlap-moe-expert-parallel-comm")
    if c.grad_reduce == "bf16":
        if training_dtype(model) == "bfloat16":  # with --fp16 the gradients reduce in fp16 by default
            args.append("--grad-reduce-in-bf16")  # main grads in bf16 (also Megatron-FSDP's)
    elif training_dtype(model) == "float16":
        # as priced (fp32 main grads, 4 B/param reduced): --bf16 implies it, --fp16 does not
        # (validate_args, arguments.py core_v0.14.0 and core_v0.19.0)
        args.append("--accumulate-allreduce-grads-in-fp32")
    if c.zero_stage >= 1:
        args.append("--use-distributed-optimizer")
    if c.optimizer_states != "fp32":  # TE's FusedAdam, inside the distributed optimizer (ZeRO >= 1)
        args += ["--use-precision-aware-optimizer", "--exp-avg-dtype", c.optimizer_states,
                 "--exp-avg-sq-dtype", c.optimizer_states]
    if c.zero_stage >= 2:
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", ZERO_SHARDING[c.zero_stage],
                 "--no-gradient-accumulation-fusion", "--ckpt-format", FSDP_CHECKPOINT_FORMAT]
    if c.dp_cp > 1:
        args.append("--overlap-grad-reduce")
        if c.zero_stage >= 1:
            # gathers the updated weights under the next step's forward (arguments.py: needs
            # the distributed optimizer or Megatron-FSDP, and --overlap-grad-reduce)
            args.append("--overlap-param-gather")
    return args


def attention_args(config: TrainConfig) -> list[str]:
    """AttnBackend (megatron/core/transformer/enums.py; language_module._set_attention_backend at
    core_v0.19.0 sets TE's NVTE_*_ATTN switches from it): flash attention at the engine's own choice
    is `auto`, under which Transformer Engine prefers its cuDNN FusedAttention on Hopper and later
    (get_attention_backend, transformer_engine/pytorch/attention/dot_product_attention/utils.py at
    v2.18: "Select FusedAttention for performance") and flash-attn on Ampere; `flash` keeps only
    flash-attn, pinned to FlashAttention-2 by --flash-attention-version 2 (TransformerConfig,
    core_v0.19.0); `unfused` is TE's kernel that materializes the scores, as the 2021-22 code did."""
    if config.attention != "flash":
        return ["--attention-backend", "unfused"]
    if config.attention_kernel == "fa2":
        return ["--attention-backend", "flash", "--flash-attention-version", "2"]
    return ["--attention-backend", "auto"]


def context_parallel_args(config: TrainConfig) -> list[str]:
    """CP (megatron/training/arguments.py core_v0.19.0): --context-parallel-size cp and
    --cp-comm-type p2p, the ring of KV sends the estimate prices (its default, named so the
    command says what was planned; a2a, allgather and a2a+p2p are not modelled)."""
    if config.cp <= 1:
        return []
    return ["--context-parallel-size", str(config.cp), "--cp-comm-type", "p2p"]


def expert_parallel_args(model: ModelSpec, config: TrainConfig, release: MegatronRelease | None = None) -> list[str]:
    """MoE execution (megatron/training/arguments.py core_v0.19.0): the experts' GEMMs grouped
    (--moe-grouped-gemm; the training estimate prices them as grouped GEMMs,
    flops.moe_mlp_gemms_forward). EP: --expert-model-parallel-size ep with whole experts per
    GPU (--expert-tensor-parallel-size 1; its default is tp) and the token dispatcher the
    estimate priced: alltoall (NCCL all-to-alls), or the flex dispatcher on DeepEP
    (--moe-token-dispatcher-type flex with --moe-flex-dispatcher-backend deepep at core_v0.19.0,
    --moe-enable-deepep at core_v0.14.0, which has no backend flag: MegatronRelease.
    flex_dispatcher_backend; core_v0.19.0 still maps the old flag but warns that it is
    deprecated, transformer_config.py __post_init__; the launch needs the deep_ep package); without EP
    Megatron's default allgather dispatcher, whose TP all-gather and reduce-scatter are the
    sequence-parallel pair the dense MLP would have."""
    if not model.is_moe:
        return []
    args = ["--moe-grouped-gemm"]
    if config.ep > 1:
        args += ["--expert-model-parallel-size", str(config.ep), "--expert-tensor-parallel-size", "1"]
        if config.moe_dispatcher == "deepep":
            release = release or MEGATRON_RELEASES[DEFAULT_MEGATRON]
            args += ["--moe-token-dispatcher-type", "flex"] + (
                ["--moe-flex-dispatcher-backend", "deepep"] if release.flex_dispatcher_backend
                else ["--moe-enable-deepep"])
        else:
            args += ["--moe-token-dispatcher-type", "alltoall"]
    return args


def fp8_args(recipe: str = "delayed") -> list[str]:
    """Transformer Engine fp8 for the blocks' linear layers (TransformerConfig fields fp8,
    fp8_recipe, fp8_amax_history_len, fp8_amax_compute_algo; transformer_config.py and
    fp8_utils.get_fp8_recipe, core_v0.19.0): the hybrid format (e4m3 forward, e5m2
    gradients; MXFP8BlockScaling, Float8BlockScaling and Float8CurrentScaling take it too) and
    --fp8-recipe, one of delayed, tensorwise, mxfp8, blockwise (choices at core_v0.14.0: tensorwise, delayed, mxfp8,
    blockwise; core_v0.19.0 adds custom; default delayed in both). Delayed scaling alone reads
    an amax history: a 1024-step window taking its max, the setting NeMo's GPT configs ship;
    the other recipes ignore the history flags, so they are left out. --bf16 stays (fp8 runs
    inside bf16 mixed precision)."""
    args = ["--fp8-format", "hybrid", "--fp8-recipe", recipe]
    if recipe == "delayed":
        args += ["--fp8-amax-history-len", str(efficiency.TRAIN_FP8_AMAX_HISTORY_LEN),
                 "--fp8-amax-compute-algo", "max"]
    return args


def megatron_steps(model: ModelSpec, cluster: ClusterSpec, config: TrainConfig,
                   global_batch: int, seq_len: int, release: MegatronRelease | None = None) -> tuple[LaunchStep, ...]:
    """One step, run on every node: torchrun + pretrain_gpt.py + the layout's arguments, for
    `release` (default DEFAULT_MEGATRON). GPipe has no Megatron flag (Megatron runs 1F1B);
    data, tokenizer and optimizer hyper-parameters are the user's to add."""
    num_gpus = config.layout.num_gpus
    num_nodes = math.ceil(num_gpus / cluster.gpus_per_node)
    argv = (list(launch_env(config)) + torchrun_argv(num_gpus, cluster) + [TRAIN_SCRIPT]
            + parallel_args(model, config, global_batch, release) + model_args(model, seq_len, config.tp))
    return (LaunchStep(ALL_NODES, NodeSet(0, num_nodes), tuple(argv)),)
