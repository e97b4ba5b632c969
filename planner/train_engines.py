"""What each training engine can run: the search space of one (tp, cp, pp, dp) per engine.

Megatron-LM's rules live in planner/train.py (structural, cp, ep and config reasons) and
planner/train_search.py (zero_options, sp_options). This module holds torchtitan's, read from
the source of one release, TORCHTITAN_RELEASE (github.com/pytorch/torchtitan, tag v0.2.2), and
is consulted through two hooks only: train_search.search_layout asks `zero_options` and
`sp_options` here for torchtitan, and train.estimate asks `torchtitan_reasons` instead of
Megatron's cp_reasons. The cost model is shared (planner/cost/): a torchtitan configuration is
priced as the TrainConfig it maps to.

Facts of torchtitan v0.2.2 used here (file@v0.2.2):
- Parallel dims (torchtitan/distributed/parallel_dims.py, ParallelDims): dp_replicate, dp_shard,
  cp, tp, pp, ep, etp; _validate asserts dp_replicate*dp_shard*cp*tp*pp == world size (ep and
  etp borrow from the others). FSDP2 shards over the "fsdp" mesh, dp_shard*cp ("we always
  assume that when cp is used, FSDP is also applied"); dp_replicate > 1 with dp_shard > 1 is
  HSDP; the batch (data-loading) degree is dp_replicate*dp_shard.
- Data parallel (models/llama3/infra/parallelize.py, parallelize_llama): fully_shard (ZeRO-3:
  weights, gradients and optimizer states sharded) whenever dp_shard*cp > 1; DDP (replicate,
  ZeRO-0) only when dp_replicate is the whole world ("DDP has not supported > 1D parallelism").
  There is no ZeRO-1 or ZeRO-2 mode.
- FSDP under PP: apply_fsdp's reshard_after_forward "default" is `not pp_enabled`, and torch's
  pipelining (torch/distributed/pipelining/stage.py, torch 2.13) sets reshard_after_backward and
  requires_gradient_sync False for every micro-batch's backward but the last
  (perform_reduce_grad): each stage gathers its weights once, keeps them and the gradients whole
  through the step, and reduce-scatters once. Memory and traffic are the distributed optimizer's,
  so with pp > 1 FSDP is planned as ZeRO-1 (fp32 master weights and Adam states sharded over
  dp*cp, one reduce-scatter and one all-gather per step).
- TP (apply_tp): attention_norm, ffn_norm and the final norm are SequenceParallel, the
  blocks' inputs Shard(1): sequence parallelism is always on with tp > 1.
- seq_len divisible by tp * 2 * cp (ParallelDims.seq_len_divisor, asserted in
  parallelize_llama), cp = 1 included.
- Pipeline (distributed/pipeline_parallel.py; schedule classes from torch.distributed.pipelining):
  single-stage schedules (1F1B, GPipe) hold one stage per rank, multi-stage ones
  (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble, ZBVZeroBubble, DualPipeV) at least two;
  stages from pipeline_parallel_layers_per_stage or module_fqns_per_model_part (any layers per
  part, pp * v parts for v chunks per rank: uneven interleaved splits as Megatron's layout
  string has them, PER_CHUNK_SPLIT_ENGINES); micro-batches
  = local_batch_size / pipeline_parallel_microbatch_size.
- Activation checkpointing (config/job_config.py ActivationCheckpoint.mode): none, selective
  (selective_ac_option "op" or every n-th layer), full, memory_budget (compiler only).
- float8 (components/quantization/float8.py): the model converter "quantize.linear.float8"
  (torchao Float8Linear, SM89 or later), settings under [quantize.linear.float8]; recipe_name
  tensorwise (the default, None), rowwise or rowwise_with_gw_hp, no delayed scaling. MXFP8
  (components/quantization/mx.py): "quantize.linear.mx" (torchao MXLinear, SM100 asserted).
- MoE (models deepseek_v3, qwen3 MoE flavors, llama4, gpt_oss): expert parallelism
  (expert_parallel_degree; the planner's ep = tp x a divisor of cp*dp is torchtitan's etp = 1 mode,
  "partial dp + all tp -> ep", job_config.py) borrows from dp_shard * cp * tp, never pp
  (parallel_dims.py: efsdp = dp_shard * cp * tp / (ep * etp); its sparse mesh (pp, dp_replicate,
  efsdp, ep, etp) over the data-loading order (pp, batch, cp, tp) makes an EP group ep
  consecutive ranks, the TP groups of its CP ranks then the next shard's: Megatron's folding,
  Layout.ep). The routed experts are wrapped
  in FSDP of their own over efsdp (models/llama4/infra/parallelize.py apply_fsdp, shared by the
  four), everything else over dp_shard * cp: the expert-data-parallel sharding Megatron-FSDP
  prices. EP without FSDP is not planned (deepseek_v3, llama4 and gpt_oss ask for the fsdp mesh
  whenever EP is on). The token dispatch (distributed/expert_parallel.py ExpertParallel) is NCCL
  all_to_all_single: the per-expert counts, then the tokens and their return (two more in the
  backward, the forward's again under full activation checkpointing), and between them one
  blocking device-to-host copy of the split sizes (`.to("cpu", non_blocking=False)` and
  `.tolist()`) every MoE forward: the host sync Megatron's dropless layers have, priced the same
  way (MOE_FORWARD_HOST_SECONDS). Without EP the grouped-GEMM path permutes on the GPU without
  a sync (moe/utils.py), except gpt_oss's experts, which read `int(offsets[-1])`
  (models/gpt_oss/model/moe.py). Pipelining: deepseek_v3 and llama4 (qwen3 and gpt_oss have no
  pipelining_fn). Context parallelism runs only with SDPA: deepseek_v3's flavors, llama4's irope
  flavors and gpt_oss use flex attention (args.py of each). float8 MoE (quantize.grouped_mm.float8)
  asserts no PP and no CP (components/quantization/float8.py); MXFP8's (mx.py) does not. DeepEP exists for deepseek_v3
  only and is not planned here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.cost import efficiency
from planner.engines import MEGATRON_RELEASES
from planner.errors import SpecError
from planner.specs import computed_once

if TYPE_CHECKING:
    from planner.layout import TrainConfig
    from planner.requests import TrainRequest
    from planner.specs import ModelSpec

TORCHTITAN_RELEASE = "v0.2.2"
"""The torchtitan git tag whose source the rules and the emitted TOML follow."""

TORCHTITAN_MODELS = {
    "llama-3.1-8b": ("llama3", "8B"),
    "llama-3.1-70b": ("llama3", "70B"),
    "llama-3.1-405b": ("llama3", "405B"),
    "qwen3-32b": ("qwen3", "32B"),
    "qwen3-30b-a3b": ("qwen3", "30B-A3B"),
    "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
    "deepseek-v3": ("deepseek_v3", "671B"),
    "llama-4-scout": ("llama4", "17bx16e_irope"),
    "gpt-oss-120b": ("gpt_oss", "120b"),
}
"""Shipped model -> torchtitan (model.name, model.flavor), from models/*/__init__.py@v0.2.2
(same layers, widths, heads, experts and top-k; Llama 4 Scout as released runs iRoPE, NoPE
every fourth layer, hence the _irope flavor)."""
ARCHITECTURE_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                       "intermediate_size", "vocab_size", "num_local_experts", "num_experts_per_tok",
                       "expert_intermediate_size", "num_shared_experts", "kv_lora_rank", "q_lora_rank", "head_dim",
                       "sliding_window")
"""What makes two specs one torchtitan model (torchtitan_model): the layers, widths, heads,
experts, top-k, vocabulary, MLA ranks and window; not the name, dtype, quantization or context."""


def torchtitan_model(model: ModelSpec) -> tuple[str, str] | None:
    """torchtitan's (model.name, model.flavor) for `model`: a shipped model's own, else the one of
    the shipped model of the same architecture (ARCHITECTURE_FIELDS), so that an HF config.json of
    Meta-Llama-3.1-70B or the llama-3.1-70b-fp8 checkpoint's spec trains as llama3 70B, with that
    family's rules (no pipelining for qwen3 and gpt_oss, flex attention's refusal of CP); None
    where torchtitan v0.2.2 has no such model."""
    known = TORCHTITAN_MODELS.get(model.name)
    if known is not None:
        return known
    return _architecture_match(model)


@computed_once
def _architecture_match(model: ModelSpec) -> tuple[str, str] | None:
    from planner.catalog import resolve_model

    key = tuple(getattr(model, name) for name in ARCHITECTURE_FIELDS)
    for name, known in TORCHTITAN_MODELS.items():
        if tuple(getattr(resolve_model(name), field) for field in ARCHITECTURE_FIELDS) == key:
            return known
    return None


TORCHTITAN_FLEX_ATTENTION = ("deepseek_v3", "gpt_oss")
"""Families whose shipped flavors run flex attention, which torchtitan's context parallelism
refuses (models/deepseek_v3/model/args.py, models/gpt_oss/model/args.py@v0.2.2); llama4's irope
flavors too (TORCHTITAN_FLEX_FLAVORS)."""
TORCHTITAN_FLEX_FLAVORS = ("17bx16e_irope", "17bx128e_irope")
TORCHTITAN_SYNC_WITHOUT_EP = ("gpt_oss",)
"""Families whose MoE block syncs the host every forward even without EP (gpt_oss's grouped
experts read int(offsets[-1]), models/gpt_oss/model/moe.py@v0.2.2)."""
TORCHTITAN_GROUPED_MM_SM90 = ("deepseek_v3", "llama4", "gpt_oss")
"""Families whose model args turn grouped GEMMs off below compute capability 9.0 ("Failed to use
grouped mm, which is only supported on SM90 or later", models/*/model/args.py@v0.2.2): their
experts then run _run_experts_for_loop (models/moe/moe.py), which reads the per-expert token
counts on the host every forward ("this would incur a synchronization")."""
TORCHTITAN_GROUPED_MM_MIN_COMPUTE_CAPABILITY = 9.0
TORCHTITAN_IMPLEMENTED = ("llama3", "llama4", "qwen3", "deepseek_v3", "gpt_oss")
"""The language models under torchtitan/models/@v0.2.2."""
TORCHTITAN_UNPIPELINED = ("qwen3", "gpt_oss")
"""Models whose TrainSpec has no pipelining_fn (models/qwen3/__init__.py and
models/gpt_oss/__init__.py@v0.2.2: pipelining_fn=None; train.py raises when pipeline
parallelism is asked of them)."""
CP_KV_ROTATION = {"megatron": "ring", "torchtitan": "allgather"}
"""How each engine moves a layer's KV chunks between context-parallel ranks: Megatron's
Transformer Engine passes them around a ring, one chunk per attention step (p2p); torchtitan
all-gathers them once (torch's default rotate method, _AllGatherRotater in
torch/distributed/tensor/experimental/_context_parallel/_attention.py; training_time.cp_seconds_per_layer)."""


def cp_exchange_label(engine: str) -> str:
    """What the engine's CP KV exchange is called in the plan (CP_KV_ROTATION): Megatron's ring
    of sends, torchtitan's all-gather."""
    return "CP all-gather" if CP_KV_ROTATION[engine] == "allgather" else "CP ring"


MOE_FORWARD_HOST_SECONDS = {"megatron": efficiency.MOE_LAYER_FORWARD_HOST_SECONDS,
                            "torchtitan": efficiency.MOE_LAYER_FORWARD_HOST_SECONDS}
"""Each engine's host time per MoE block forward after the block's token-count sync
(training_time.moe_host_exposed_seconds), where it syncs (moe_forward_syncs). Megatron's is
fitted to NVIDIA's MoE runs; torchtitan's is that value as an estimate (no torchtitan MoE
measurement is at hand; its eager block issues a comparable stream of kernels from Python,
FSDP2 and DTensor hooks included): `--moe-host-ms` replaces it and `plan explain` moves it."""
PER_CHUNK_SPLIT_ENGINES = ("megatron", "torchtitan")
"""Engines that can name each model chunk's layers, so an interleaved stage needs only one layer
per chunk (stage_split.split_reason's `layout`): Megatron's --pipeline-model-parallel-layout
and torchtitan's module_fqns_per_model_part (one module list per model part, pp * v of them,
part k on rank k % pp: distributed/pipeline_parallel.py@v0.2.2, the "loop" stage ids)."""
TORCHTITAN_SCHEDULES = {"1f1b": "1F1B", "interleaved": "Interleaved1F1B", "gpipe": "GPipe"}
"""Our schedule -> torchtitan's pipeline_parallel_schedule (torch.distributed.pipelining names)."""

TORCHTITAN_AC_MODES = {"none": "none", "op": "selective", "selective": "selective", "full": "full"}
"""Our recompute -> [activation_checkpoint] mode ("op" and "selective" both torchtitan's per-op
selective checkpointing, selective_ac_option = "op"; "selective" where only Megatron's pricing
of it applies: train.op_recompute_refusal)."""


def check_request(model: ModelSpec, request: TrainRequest) -> None:
    """Requests the engine cannot express at all: one-line spec errors (exit 2)."""
    if request.engine == "megatron":
        release = MEGATRON_RELEASES[request.engine_versions.megatron]
        if request.attention_kernel == "fa2" and not release.flash_attention_version:
            raise SpecError(f"--attention-kernel fa2: Megatron-LM {release.version} has no --flash-attention-version "
                            "(TransformerConfig), so its --attention-backend flash runs whichever flash-attn is "
                            "installed; use --engine-version megatron=core_v0.19.0")
    if request.engine != "torchtitan":
        if request.optimizer_states != "fp32" and request.zero_stage == 0:
            raise SpecError(f"--optimizer-states {request.optimizer_states} with --zero 0: Megatron's precision-aware "
                            "optimizer runs only in the distributed optimizer; use --zero 1 or more")
        return
    if request.optimizer_states != "fp32":
        raise SpecError(f"--optimizer-states {request.optimizer_states}: torchtitan {TORCHTITAN_RELEASE} keeps Adam's "
                        "moments in the parameters' float32 (torch.optim.AdamW); use --engine megatron")
    if request.attention != "flash":
        raise SpecError("--attention materialized: torchtitan runs SDPA or flex attention (no s x s "
                        "scores kept); use --attention flash")
    if request.attention_kernel == "fa2":
        raise SpecError(f"--attention-kernel fa2: torchtitan {TORCHTITAN_RELEASE} runs SDPA with cuDNN's kernel "
                        "first (torchtitan/models/attention.py, ScaledDotProductAttentionWrapper) and no job-config "
                        "key selects FlashAttention-2; use --engine megatron or --attention-kernel auto")
    if request.zero_stage == 2:
        raise SpecError(f"--zero 2: torchtitan {TORCHTITAN_RELEASE} has no ZeRO-2: FSDP2 shards the parameters "
                        "with the gradients and optimizer state (ZeRO-3), in effect ZeRO-1 under pipelining, and "
                        "replicates with DDP (ZeRO-0); use --zero 3 (or --zero 1 with pp > 1), or --engine megatron")
    if request.grad_reduce != "fp32":
        raise SpecError(f"--grad-reduce {request.grad_reduce}: torchtitan {TORCHTITAN_RELEASE} reduces gradients "
                        "in float32 only (training.mixed_precision_reduce); use --grad-reduce fp32")
    if request.resolved_fp8_recipe == "blockwise":
        raise SpecError(f"--fp8-recipe blockwise: torchtitan {TORCHTITAN_RELEASE} has no block-scaled fp8 "
                        "(float8 tensorwise, which --fp8-recipe tensorwise prices, or rowwise, which the planner "
                        "does not; MX mxfp8 on Blackwell); use --engine megatron or --fp8-recipe tensorwise")
    if request.resolved_fp8_recipe == "delayed":
        raise SpecError(f"--fp8-recipe delayed: torchtitan {TORCHTITAN_RELEASE}'s float8 (torchao) has no delayed "
                        "scaling, only dynamic scaling; use --fp8-recipe tensorwise (or, on Blackwell, mxfp8)")


def zero_stage_for(tp: int, pp: int, dp: int, cp: int) -> tuple[int, ...]:
    """The ZeRO stages torchtitan's data parallelism amounts to: 0 without data parallelism;
    1 with pp > 1 (FSDP under pipelining, see the module docstring); 3 (FSDP2 over dp*cp)
    otherwise, and also 0 (DDP) when the ranks are pure replicas (tp = pp = cp = 1)."""
    if dp * cp == 1:
        return (0,)
    if pp > 1:
        return (1,)
    return (3, 0) if tp == cp == 1 else (3,)


def zero_options(request: TrainRequest, tp: int, pp: int, dp: int, cp: int = 1) -> list[int]:
    """The search's ZeRO stages under torchtitan; `--zero` is tried as given (the estimate
    rejects what torchtitan cannot run)."""
    if request.zero_stage is not None:
        return [request.zero_stage]
    return list(zero_stage_for(tp, pp, dp, cp))


def sp_options(request: TrainRequest, tp: int) -> list[bool]:
    """torchtitan's TP always shards the norms over the sequence: on exactly when tp > 1
    (`--sequence-parallel` is tried as given and rejected when it disagrees)."""
    if request.sequence_parallel is not None:
        return [request.sequence_parallel]
    return [tp > 1]


def torchtitan_reasons(model: ModelSpec, config: TrainConfig, seq_len: int) -> list[str]:
    """Why torchtitan cannot run this configuration (assumes Megatron's structural checks
    passed: heads and FFN divisible by tp, batch by dp)."""
    c, reasons = config, []
    allowed = zero_stage_for(c.tp, c.pp, c.dp, c.cp)
    if c.zero_stage not in allowed:
        reasons.append(f"ZeRO-{c.zero_stage} is not how torchtitan shards tp={c.tp} cp={c.cp} pp={c.pp} "
                       f"dp={c.dp} (it runs ZeRO-{' or ZeRO-'.join(map(str, allowed))})")
    if c.sequence_parallel != (c.tp > 1):
        reasons.append("torchtitan's TP always uses sequence parallelism (and none without TP)")
    divisor = c.tp * 2 * c.cp
    if seq_len % divisor:
        reasons.append(f"seq-len {seq_len} not divisible by tp*2*cp = {divisor} (torchtitan)")
    family, flavor = torchtitan_model(model) or ("", "")
    if c.dp * c.cp == 1 and (c.tp > 1 or c.pp > 1):
        reasons.append(f"dp*cp = 1 with {'tp' if c.tp > 1 else 'pp'} > 1: torchtitan {TORCHTITAN_RELEASE} applies "
                       f"mixed precision through FSDP, or autocast without TP and PP, so this trains in fp32 "
                       f"(distributed/utils.py maybe_enable_amp: \"Mixed precision training is disabled\")")
    if c.ep > 1 and c.zero_stage == 0:
        reasons.append(f"ep={c.ep} without FSDP (ZeRO-0: DDP, or dp*cp = 1): torchtitan {TORCHTITAN_RELEASE} runs "
                       f"expert parallelism only under FSDP (the experts' own efsdp mesh)")
    if c.pp > 1 and family in TORCHTITAN_UNPIPELINED:
        reasons.append(f"torchtitan {TORCHTITAN_RELEASE} cannot pipeline {family} (its TrainSpec has no "
                       f"pipelining_fn)")
    if c.cp > 1 and (family in TORCHTITAN_FLEX_ATTENTION or flavor in TORCHTITAN_FLEX_FLAVORS):
        reasons.append(f"torchtitan {TORCHTITAN_RELEASE}'s {family} {flavor} runs flex attention, which its "
                       f"context parallelism refuses (SDPA only)")
    if model.is_moe and c.precision == "fp8" and c.fp8_recipe != "mxfp8" and (c.pp > 1 or c.cp > 1):
        reasons.append(f"torchtitan {TORCHTITAN_RELEASE}'s float8 MoE (grouped GEMMs) runs without pipeline "
                       f"and context parallelism (components/quantization/float8.py asserts)")
    if c.precision == "fp8" and c.fp8_recipe == "mxfp8" and c.tp > 1:
        reasons.append(f"torchtitan {TORCHTITAN_RELEASE}'s MXFP8 linears refuse TP under torch.compile, which its "
                       f"fp8 runs enable (components/quantization/mx.py asserts \"TP not yet supported with "
                       f"torch.compile for mxfp8\")")
    kv_heads = model.num_key_value_heads
    if not model.is_mla and kv_heads % c.tp:
        reasons.append(f"tp={c.tp} does not divide the {kv_heads} KV heads: torchtitan shards wk/wv over tp "
                       f"without replicating heads (models/{family or 'llama3'}/infra/parallelize.py@{TORCHTITAN_RELEASE})")
    return reasons


def moe_forward_syncs(engine: str, model: ModelSpec, ep: int, compute_capability: float | None = None) -> bool:
    """Whether the engine's MoE block syncs the host on its token counts every forward
    (training_time.moe_host_exposed_seconds prices the wait): Megatron's dropless layers always
    (experts.py's tokens_per_expert.tolist(), the all-to-all's split sizes); torchtitan's under
    EP (the split sizes, expert_parallel.py), gpt_oss's always (module docstring), and below
    SM90 those of the families that then loop over their experts (TORCHTITAN_GROUPED_MM_SM90;
    `compute_capability` the GPU's, None: not known, not priced)."""
    if not model.is_moe:
        return False
    if engine != "torchtitan":
        return True
    family = (torchtitan_model(model) or ("",))[0]
    looped = (family in TORCHTITAN_GROUPED_MM_SM90 and compute_capability is not None
              and compute_capability < TORCHTITAN_GROUPED_MM_MIN_COMPUTE_CAPABILITY)
    return ep > 1 or family in TORCHTITAN_SYNC_WITHOUT_EP or looped


def torchtitan_degrees(config: TrainConfig) -> dict[str, int]:
    """[parallelism] degrees: dp_replicate * dp_shard * cp * tp * pp = the GPUs. FSDP (ZeRO-3,
    or ZeRO-1 under PP) shards over all dp ranks (dp_shard = dp); DDP (ZeRO-0 with dp > 1)
    replicates (dp_replicate = dp). HSDP is not planned."""
    c = config
    replicate = c.dp if c.zero_stage == 0 else 1
    degrees = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": c.dp // replicate,
        "tensor_parallel_degree": c.tp,
        "pipeline_parallel_degree": c.pp,
        "context_parallel_degree": c.cp,
    }
    if c.ep > 1:  # etp = 1: EP takes all of TP and part of dp_shard (Layout.ep = tp x a divisor of dp)
        degrees.update(expert_parallel_degree=c.ep, expert_tensor_parallel_degree=1)
    return degrees
