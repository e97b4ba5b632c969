"""The thin command line: parse -> load specs -> one planner call -> render.

Each option `plan` and `plan explain` share is declared once, as an `Annotated` alias
below; its default is read from the request dataclasses (planner/requests.py), which also
check the values. Every user mistake ends as one line on stderr and exit code 2; "no
feasible layout" is exit code 1; success is 0.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from planner import __version__, units
from planner.emit.command import MODEL_PLACEHOLDER
from planner.engines import RELEASES, parse_engine_versions
from planner.errors import SpecError
from planner.requests import (
    ALL2ALL_BACKENDS,
    DEFAULT_TOP_ROWS,
    DRAFT_MODEL_METHODS,
    DRAFT_MODEL_PLACEHOLDER,
    MOE_BACKENDS,
    PROMPT_TOKENIZERS,
    LayoutFilter,
    ServeRequest,
    Speculation,
    TrainRequest,
    for_vllm_release,
    served_dtype,
)

if TYPE_CHECKING:
    from planner.specs import ModelSpec

EXAMPLES = """Examples:

\b
  plan --model llama-3.1-70b --cluster 2x8xA100
  plan --model model_specs/llama-3.1-405b.yaml --cluster hardware_profiles/2x8xH100.yaml --objective latency
  plan --model ./Llama-3.1-8B/config.json --cluster 1x4xL40S --max-model-len 8192 --json
  plan --workload train --model gpt3-175b --cluster 16x8xA100 --global-batch 1536 --seq-len 2048
  plan explain --model llama-3.1-405b --cluster 2x8xH100
  plan probe --backend gloo --nproc-per-node 2 --out measured.yaml
  plan models | plan clusters | plan gpus
"""

app = typer.Typer(
    name="plan",
    help="Split a large language model over a GPU cluster (tensor x pipeline x data "
    "parallel): why, and how to launch it.\n\n" + EXAMPLES,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=False,
)


class Workload(str, Enum):
    serve = "serve"
    train = "train"


class ObjectiveChoice(str, Enum):
    throughput = "throughput"
    latency = "latency"


class Emit(str, Enum):
    vllm = "vllm"
    vllm_ray = "vllm-ray"
    sglang = "sglang"
    megatron = "megatron"
    torchtitan = "torchtitan"
    none = "none"


class Engine(str, Enum):
    megatron = "megatron"
    torchtitan = "torchtitan"


class KvCacheDtype(str, Enum):
    auto = "auto"
    fp8 = "fp8"


MoeBackend = Enum("MoeBackend", {name: name for name in MOE_BACKENDS}, type=str)
"""--moe-backend's choices: requests.MOE_BACKENDS."""
PromptTokenizerChoice = Enum("PromptTokenizerChoice", {name: name for name in PROMPT_TOKENIZERS}, type=str)
"""--prompt-tokenizer's choices: requests.PROMPT_TOKENIZERS."""
All2AllBackend = Enum("All2AllBackend", {name: name for name in ALL2ALL_BACKENDS}, type=str)
"""--all2all-backend's choices: requests.ALL2ALL_BACKENDS."""


class QuantChoice(str, Enum):
    none = "none"
    fp8 = "fp8"
    int8 = "int8"
    int4 = "int4"


class Schedule(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved = "interleaved"


class Recompute(str, Enum):
    none = "none"
    outputs = "outputs"
    op = "op"
    selective = "selective"
    full = "full"


class Attention(str, Enum):
    flash = "flash"
    materialized = "materialized"


class AttentionKernel(str, Enum):
    auto = "auto"
    fa2 = "fa2"


class Precision(str, Enum):
    bf16 = "bf16"
    fp8 = "fp8"


class Fp8RecipeChoice(str, Enum):
    delayed = "delayed"
    tensorwise = "tensorwise"
    mxfp8 = "mxfp8"
    blockwise = "blockwise"


class SpeculativeMethod(str, Enum):
    mtp = "mtp"
    eagle = "eagle"
    eagle3 = "eagle3"
    ngram = "ngram"


class MoeDispatcherChoice(str, Enum):
    auto = "auto"
    alltoall = "alltoall"
    deepep = "deepep"


class GradReduce(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


class OptimizerStates(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


# The options `plan` and `plan explain` share. Defaults come from the request dataclasses.
ModelOpt = Annotated[str | None, typer.Option(help="Shipped name, model YAML, or HF config.json (file or directory).")]
ClusterOpt = Annotated[str | None, typer.Option(help="Shipped name, hardware profile YAML, or NxMxGPU (e.g. 2x8xA100).")]
WorkloadOpt = Annotated[Workload, typer.Option(help="serve (vLLM/SGLang) or train (Megatron-LM/torchtitan).")]
GpusOpt = Annotated[int | None, typer.Option(help="Plan for this many of the cluster's GPUs.")]
LayoutOpt = Annotated[str | None, typer.Option(help="Keep only layouts matching e.g. tp=8,pp=2 (degrees not given are searched; training: cp=1 rules context parallelism out).")]
ObjectiveOpt = Annotated[ObjectiveChoice, typer.Option(help="Rank by throughput or latency.")]
MaxTpotMsOpt = Annotated[float | None, typer.Option(help="Serve SLA: mean time per output token under load, ms (concurrency is lowered to meet it).")]
MaxTtftMsOpt = Annotated[float | None, typer.Option(help="Serve SLA: mean time to first token under load, ms.")]
class Mode(str, Enum):
    auto = "auto"
    aggregated = "aggregated"
    disaggregated = "disaggregated"


ModeOpt = Annotated[Mode, typer.Option(help="Serve: aggregated, disaggregated prefill/decode workers, or auto (both, and which wins).")]
MaxE2eMsOpt = Annotated[float | None, typer.Option(help="Serve SLA: mean end-to-end request latency, ms.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON (SI units) instead of tables.")]
InputLenOpt = Annotated[int, typer.Option(help="Serve: prompt tokens per request.")]
OutputLenOpt = Annotated[int, typer.Option(help="Serve: generated tokens per request.")]
BatchOpt = Annotated[int | None, typer.Option(help="Serve: concurrent sequences per replica, emitted as --max-num-seqs (default: vLLM's own max-num-seqs for the release and GPU, 1024 or 256, capped by the KV cache and the step's token budget; the peak-throughput concurrency where prompts overflow the budget; 1 with --objective latency unless a finite --request-rate or --max-concurrency sets the load); disaggregated, per decode worker (prefill workers take what the budget admits).")]
MaxModelLenOpt = Annotated[int | None, typer.Option(help="Serve: context length (default: the model's max_position_embeddings).")]
GpuMemoryUtilizationOpt = Annotated[float, typer.Option(help="Serve: vLLM's fraction of GPU memory.")]
KvCacheDtypeOpt = Annotated[KvCacheDtype, typer.Option(help="Serve: KV cache dtype. auto = the engine's: the model's 16 bits, or the fp8 cache a ModelOpt checkpoint's quantization config names (vLLM 0.17+, SGLang; priced and emitted).")]
EnableDboOpt = Annotated[bool, typer.Option("--enable-dbo", help="Serve, MoE with EP across DP ranks over DeepEP: dual-batch overlap (vLLM's enable_dbo; SGLang's two-batch overlap): a step of 32 decode tokens or 512 with prompts runs as two micro-batches, each one's EP exchange hidden behind the other's work, at the price of reading the weights twice.")]
AsyncSchedulingOpt = Annotated[bool | None, typer.Option("--async-scheduling/--no-async-scheduling", help="Serve: vLLM's async scheduling (SGLang's overlap scheduler): step k+1 is scheduled as step k starts, hiding the host's work but making a request that arrives mid-step wait for the step after next (default: the release's, on for vllm 0.22.0 and 0.33.0 except 0.22.0 with ngram, off for 0.6.6.post1).")]
All2AllBackendOpt = Annotated[All2AllBackend, typer.Option(help="Serve, MoE with EP across DP ranks: how tokens reach their experts (vLLM's all2all_backend; SGLang's moe_a2a_backend deepep): allgather_reducescatter = vLLM's default, every rank gathers the group's tokens; deepep_low_latency / deepep_high_throughput = DeepEP's kernels, each token only to its experts' ranks (fp8 for block-fp8 experts), DeepEP's buffers taken from the KV cache. DeepEP must be installed with the engine.")]
PromptTokenizerOpt = Annotated[PromptTokenizerChoice, typer.Option(help="Serve: how the API server tokenizes the text prompts before the engine sees them, 1.7 us a prompt token on one thread, in TTFT: auto = the engine's (vLLM 0.33.0, 0.6.6.post1 and SGLang: serial, one prompt after another; vLLM 0.22.0: microbatch, batches of up to 32 after a 2 ms wait); serial / microbatch price that front end instead (a what-if: the command does not change); none = the clients send token ids.")]
SpeculativeMethodOpt = Annotated[SpeculativeMethod | None, typer.Option(help="Serve: speculative decoding (vLLM's speculative_config method): mtp = the model's own multi-token-prediction layers; eagle / eagle3 = a draft head (--draft-model); ngram = prompt lookup on the host. Needs --draft-acceptance.")]
NumSpeculativeTokensOpt = Annotated[int | None, typer.Option(help="Serve, with --speculative-method: tokens drafted per sequence and step (default for mtp: the model's MTP layers).")]
DraftAcceptanceOpt = Annotated[str | None, typer.Option(help="Serve, with --speculative-method: the acceptance rate of each drafted position given the ones before it, e.g. 0.8,0.6,0.4 (one value: every position), as vLLM's spec-decode metrics report it on your traffic.")]
DraftModelOpt = Annotated[str | None, typer.Option(help="Serve, --speculative-method eagle/eagle3: the draft head's spec (shipped name, YAML, or HF config.json).")]
ServedDraftModelOpt = Annotated[str, typer.Option(help="Serve: the draft checkpoint argument written into launch commands (path or HF id).")]
MoeBackendOpt = Annotated[MoeBackend, typer.Option(help="Serve, MoE: the routed experts' kernel (vLLM's moe_backend): auto = the engine's pick; marlin = the weight-only Marlin kernel; flashinfer_mxfp8 = FlashInfer's TRT-LLM kernel with MXFP8 activations (MXFP4 experts, Blackwell); each priced at its measured rates.")]
QuantizationOpt = Annotated[QuantChoice | None, typer.Option(help="Weight quantization (overrides the spec).")]
MaxNumBatchedTokensOpt = Annotated[int | None, typer.Option(help="Serve: vLLM's token budget per step.")]
ExpertImbalanceOpt = Annotated[float | None, typer.Option(help="MoE with expert parallelism: routed tokens on the busiest GPU over the mean (>= 1; default from measured routers, docs/cost-model.md).")]
RequestRateOpt = Annotated[float | None, typer.Option(help="Serve: requests/s arriving, as vllm bench serve sends them: a finite rate prices every layout (and disaggregated deployment) at that load, ranking those that keep up by mean E2E, and simulates the burst; inf = all at once (the burst only).")]
RendererNumWorkersOpt = Annotated[int, typer.Option(help="Serve: tokenizer threads per API server, each taking the text prompts one at a time (vLLM's --renderer-num-workers, SGLang's --tokenizer-worker-num; emitted when above 1): priced in TTFT, where a burst or a high rate of long prompts queues for a thread.")]
MaxConcurrencyOpt = Annotated[int | None, typer.Option(help="Serve: the simulated burst's client keeps at most this many requests in flight (vllm bench serve --max-concurrency); layouts, and disaggregated deployments, are ranked under that many closed-loop clients.")]
NumPromptsOpt = Annotated[int | None, typer.Option(help="Serve: requests in the simulated burst (default 1000, vllm bench serve's).")]
BurstinessOpt = Annotated[float | None, typer.Option(help="Serve: the simulated burst's arrivals as vllm bench serve --burstiness b draws them at a finite --request-rate: gamma intervals of shape b (1 = Poisson, below 1 burstier, above 1 more even). The layouts stay priced for Poisson arrivals.")]
RandomRangeRatioOpt = Annotated[float | None, typer.Option(help="Serve: the simulated burst's lengths drawn uniformly from [L(1-r), L(1+r)] around --input-len/--output-len (vllm bench serve --random-range-ratio, 0 <= r < 1).")]
DatasetOpt = Annotated[str | None, typer.Option(help='Serve: JSONL of {"input_len": N, "output_len": M} per request (the means are planned for, the burst uses each).')]
GlobalBatchOpt = Annotated[int | None, typer.Option(help="Train: sequences per optimizer step.")]
SeqLenOpt = Annotated[int | None, typer.Option(help="Train: sequence length.")]
MicroBatchOpt = Annotated[int | None, typer.Option(help="Train: fix the micro-batch size.")]
ScheduleOpt = Annotated[Schedule | None, typer.Option(help="Train: pipeline schedule.")]
VirtualStagesOpt = Annotated[int | None, typer.Option(help="Train: virtual stages per device (interleaved).")]
RecomputeOpt = Annotated[Recompute | None, typer.Option(help="Train: activation recomputation: none; outputs (MoE and MLA models: Megatron's --recompute-modules moe_act layernorm mla_up_proj, the activation, norm and up-projection outputs dropped and rerun); op (torchtitan, dense models in bf16: its per-op selective checkpointing, every second matmul and the elementwise ops rerun; its selective level there); selective (the attention core); full (the whole layer). Default: the least that fits.")]
RecomputeNumLayersOpt = Annotated[int | None, typer.Option(help="Train, Megatron: full recompute of only the first N layers of each model chunk, the others keeping every activation (--recompute-method block --recompute-num-layers N); implies --recompute full. Default: with full recompute the search takes the least N that fits.")]
SequenceParallelOpt = Annotated[bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="Train: fix sequence parallelism.")]
ZeroOpt = Annotated[int | None, typer.Option(help="Train: ZeRO stage 0-3 (1 = distributed optimizer).")]
AttentionOpt = Annotated[Attention, typer.Option(help="Train: flash (current stacks) or materialized (2021-22 Megatron-LM, DeepSpeed).")]
AttentionKernelOpt = Annotated[AttentionKernel, typer.Option(help="Train, --attention flash: the kernel's speed. auto: what the engine picks by itself (Transformer Engine: cuDNN's fused attention on Hopper and later, --attention-backend auto; torchtitan: SDPA, cuDNN first), at the GPU's measured rate; fa2: FlashAttention-2 forced (Megatron --attention-backend flash --flash-attention-version 2, as 2023-24 stacks ran), 35% of the 16-bit peak on Hopper and later.")]
PrecisionOpt = Annotated[Precision | None, typer.Option(help="Train: bf16, or fp8 linear GEMMs through Transformer Engine (GPUs with fp8 tensor cores: Ada, Hopper or later). Default: 16-bit, in the checkpoint's 16 bits with Megatron (--fp16 for a float16 checkpoint), bfloat16 with torchtitan; bf16 given trains in bfloat16 whatever the checkpoint's.")]
Fp8RecipeOpt = Annotated[Fp8RecipeChoice | None, typer.Option(help="Train, with --precision fp8: the scaling recipe, delayed, tensorwise (current scaling), mxfp8 (Blackwell) or blockwise (1x128 / 128x128 blocks, Hopper and later; Megatron only); default the engine's own (Megatron delayed, torchtitan tensorwise).")]
GradReduceOpt = Annotated[GradReduce, typer.Option(help="Train: the main gradients' dtype, in which they accumulate and reduce: fp32 (Megatron's default) or bf16 (--grad-reduce-in-bf16: half the gradient memory and DP traffic).")]
OptimizerStatesOpt = Annotated[OptimizerStates, typer.Option(help="Train: Adam's moments' dtype: fp32 (Megatron's default) or bf16 (--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16: the optimizer's 12 bytes per parameter become 6, the fp32 master weights kept as 16-bit remainders, or 8 with fp8 recipes other than delayed; needs ZeRO >= 1). Megatron only.")]
TpCommOverlapOpt = Annotated[bool, typer.Option("--tp-comm-overlap/--no-tp-comm-overlap", help="Train: Transformer Engine's TP communication/GEMM overlap where Megatron can run it (SP on, TP inside a node, dense blocks).")]
MoeCommOverlapOpt = Annotated[bool, typer.Option("--moe-comm-overlap/--no-moe-comm-overlap", help="Train, MoE: Megatron's expert-parallel all-to-all overlap (--overlap-moe-expert-parallel-comm: one micro-batch's forward beside another's backward) where it can run (EP, no full recompute, interleaving when pp > 1).")]
MtpLayersOpt = Annotated[int | None, typer.Option(help="Train: multi-token-prediction modules (0-16) trained on the last stage (Megatron's --mtp-num-layers; DeepSeek-V3 sec. 2.2). Default: the spec's (num_nextn_predict_layers) with Megatron, 0 with torchtitan (which builds none) or a learned-position model; 0 trains the main model only.")]
MoeHostMsOpt = Annotated[float | None, typer.Option(help="Train, MoE (Megatron): the host's time in ms to issue one MoE block's forward, which the GPU waits out after each MoE layer's token-count sync where its own forward is shorter (default: 6.1, fitted to NVIDIA's eager runs; lower it for a run that captures the block in CUDA graphs or a measured host).")]
MoeDispatcherOpt = Annotated[MoeDispatcherChoice, typer.Option(help="Train, MoE with EP: Megatron's token dispatcher, alltoall (NCCL all-to-alls), deepep (the flex dispatcher on DeepEP: each token crosses to another node once per node its experts are on; needs the deep_ep package) or auto (DeepEP where it can run and prices faster).")]
EngineOpt = Annotated[Engine, typer.Option(help="Train: the framework whose parallelism rules bound the search and whose launch is printed (torchtitan: release v0.2.2).")]
EngineVersionOpt = Annotated[str, typer.Option(help="Engine releases the plan and commands are for, ENGINE=VERSION,... "
                                               "(engines not named keep the default). Known: " + "; ".join(
                                                   f"{e} {', '.join(r)}" for e, r in RELEASES.items()) + ".")]

DEFAULT_OBJECTIVE = ObjectiveChoice(ServeRequest.objective)
DEFAULT_MODE = Mode(ServeRequest.mode)
DEFAULT_KV_CACHE_DTYPE = KvCacheDtype(ServeRequest.kv_cache_dtype)
DEFAULT_MOE_BACKEND = MoeBackend(ServeRequest.moe_backend)
DEFAULT_ALL2ALL_BACKEND = All2AllBackend(ServeRequest.all2all_backend)
DEFAULT_ATTENTION = Attention(TrainRequest.attention)
DEFAULT_ATTENTION_KERNEL = AttentionKernel(TrainRequest.attention_kernel)
DEFAULT_ENGINE = Engine(TrainRequest.engine)
DEFAULT_ENGINE_VERSION = str(ServeRequest.engine_versions)


@dataclass(frozen=True)
class PlanOptions:
    """What `plan` and `plan explain` share, as parsed (enums still enums, --layout text)."""

    model: str | None
    cluster: str | None
    workload: Workload
    gpus: int | None
    layout: str | None
    objective: ObjectiveChoice
    max_tpot_ms: float | None
    max_ttft_ms: float | None
    max_e2e_ms: float | None
    json_output: bool
    input_len: int
    output_len: int
    batch: int | None
    max_model_len: int | None
    gpu_memory_utilization: float
    kv_cache_dtype: KvCacheDtype
    moe_backend: MoeBackend
    all2all_backend: All2AllBackend
    enable_dbo: bool
    quantization: QuantChoice | None
    max_num_batched_tokens: int | None
    request_rate: float | None
    num_prompts: int | None
    max_concurrency: int | None
    dataset: str | None
    global_batch: int | None
    seq_len: int | None
    micro_batch: int | None
    schedule: Schedule | None
    virtual_stages: int | None
    recompute: Recompute | None
    sequence_parallel: bool | None
    zero: int | None
    attention: Attention = DEFAULT_ATTENTION
    attention_kernel: AttentionKernel = DEFAULT_ATTENTION_KERNEL
    precision: Precision | None = None
    fp8_recipe: Fp8RecipeChoice | None = None
    tp_comm_overlap: bool = True
    moe_comm_overlap: bool = True
    moe_dispatcher: MoeDispatcherChoice = MoeDispatcherChoice.auto
    moe_host_ms: float | None = None
    mtp_layers: int | None = None
    grad_reduce: GradReduce = GradReduce.fp32
    optimizer_states: OptimizerStates = OptimizerStates.fp32
    engine_version: str = DEFAULT_ENGINE_VERSION
    mode: Mode = DEFAULT_MODE
    expert_imbalance: float | None = None
    engine: Engine = DEFAULT_ENGINE
    random_range_ratio: float | None = None
    burstiness: float | None = None
    speculative_method: SpeculativeMethod | None = None
    num_speculative_tokens: int | None = None
    draft_acceptance: str | None = None
    draft_model: str | None = None
    served_draft_model: str = DRAFT_MODEL_PLACEHOLDER
    async_scheduling: bool | None = None
    prompt_tokenizer: PromptTokenizerChoice = PromptTokenizerChoice.auto
    renderer_num_workers: int = 1
    recompute_num_layers: int | None = None


def _value(choice: Enum | None) -> str | None:
    return None if choice is None else choice.value


def parse_layout(text: str | None, training: bool = False) -> LayoutFilter:
    """`--layout tp=8,pp=2`; cp=N (context parallelism) only for training."""
    if text is None:
        return LayoutFilter()
    if not text.strip():
        raise SpecError("--layout: empty; give degrees such as tp=8,pp=2 (or drop --layout to search every layout)")
    degrees: dict[str, int] = {}
    keys = ("tp", "cp", "pp", "dp", "ep") if training else ("tp", "pp", "dp", "ep")
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if key == "cp" and not training:
            raise SpecError(f"--layout: {part.strip()!r}: context parallelism (cp) is a training degree "
                            "(--workload train)")
        # ASCII digits only, at most 9 (str.isdigit takes '²', which int() refuses)
        if not sep or key not in keys or not re.fullmatch(r"[0-9]{1,9}", value) or int(value) < 1:
            expected = "tp=N, cp=N, pp=N, dp=N or ep=N" if training else "tp=N, pp=N, dp=N or ep=N"
            raise SpecError(f"--layout: {part.strip()!r}: expected {expected} with N >= 1")
        if key in degrees:
            raise SpecError(f"--layout: {key} given twice")
        degrees[key] = int(value)
    return LayoutFilter(**degrees)


def parse_acceptance(text: str) -> tuple[float, ...]:
    """`--draft-acceptance 0.8,0.6,0.4` (the range is Speculation's to check)."""
    rates = []
    for part in text.split(","):
        try:
            rates.append(float(part))
        except ValueError:
            raise SpecError(f"--draft-acceptance: {part.strip()!r} is not a number (expected e.g. 0.8,0.6,0.4)") from None
    return tuple(rates)


def speculation(opts: PlanOptions, model: ModelSpec) -> Speculation | None:
    """--speculative-method and its companions as a Speculation; None when it is not given (and
    then none of them may be)."""
    served_draft = None if opts.served_draft_model == DRAFT_MODEL_PLACEHOLDER else opts.served_draft_model
    if opts.speculative_method is None:
        for flag, value in (("--num-speculative-tokens", opts.num_speculative_tokens),
                            ("--draft-acceptance", opts.draft_acceptance), ("--draft-model", opts.draft_model),
                            ("--served-draft-model", served_draft)):
            if value is not None:
                raise SpecError(f"{flag}: only with --speculative-method")
        return None
    if served_draft is not None and opts.draft_model is None:
        raise SpecError("--served-draft-model: names the --draft-model's checkpoint; give --draft-model too")
    method = opts.speculative_method.value
    num_tokens = opts.num_speculative_tokens
    if method == "mtp" and not model.num_mtp_layers:
        raise SpecError(f"--speculative-method mtp: {model.name} has no multi-token-prediction layers "
                        f"(num_mtp_layers / num_nextn_predict_layers is 0)")
    if num_tokens is None:
        if method != "mtp":
            raise SpecError(f"--num-speculative-tokens: needed with --speculative-method {method} "
                            f"(tokens drafted per sequence and step)")
        num_tokens = model.num_mtp_layers  # vLLM's default for MTP (SpeculativeConfig.__post_init__)
    rates = None if opts.draft_acceptance is None else parse_acceptance(opts.draft_acceptance)
    if method == "mtp" and opts.num_speculative_tokens is None and rates is not None and len(rates) not in (1, num_tokens):
        raise SpecError(f"--draft-acceptance: {len(rates)} rates, but mtp drafts {num_tokens} token(s) per step by "
                        f"default ({model.name}'s MTP layers); give --num-speculative-tokens {len(rates)}")
    if opts.draft_acceptance is None:
        raise SpecError("--draft-acceptance: needed with --speculative-method (the share of drafted tokens the "
                        "model accepts at each position, e.g. 0.8,0.6,0.4, as vLLM's spec-decode metrics report "
                        "it on your traffic)")
    draft = None
    if opts.draft_model is not None and method not in DRAFT_MODEL_METHODS:
        raise SpecError(f"--draft-model: only with --speculative-method {' or '.join(DRAFT_MODEL_METHODS)} "
                        f"(got {method})")
    if opts.draft_model is not None:
        from planner.catalog import resolve_model
        from planner.cost.speculative import as_draft_head, draft_reasons

        try:
            draft = resolve_model(opts.draft_model)
        except SpecError as error:
            message = str(error)
            named = message.replace("--model:", "--draft-model:", 1)
            raise SpecError(named if named != message else f"--draft-model: {message}") from None
        reasons = draft_reasons(model, draft)
        if reasons:
            raise SpecError(f"--draft-model: {'; '.join(reasons)}")
        draft = as_draft_head(model, draft, method)
    check_served_model(opts.served_draft_model, "--served-draft-model")
    return Speculation(method, num_tokens, rates, draft, opts.served_draft_model)


def serve_request(opts: PlanOptions, quantization_override: str | None = None,
                  model: ModelSpec | None = None, checkpoint_dtype: str | None = None) -> ServeRequest:
    """`quantization_override`: the third value load_specs() returns. With --dataset the
    planned lengths are the dataset's means. `model`: the spec --speculative-method refers to."""
    from planner.workload import load_dataset  # the cost model and specs: not for --help

    lengths, line_numbers = ((), ()) if opts.dataset is None else load_dataset(opts.dataset)
    input_len, output_len = opts.input_len, opts.output_len
    if lengths:
        input_len = max(1, round(sum(i for i, _ in lengths) / len(lengths)))
        output_len = max(1, round(sum(o for _, o in lengths) / len(lengths)))
    return for_vllm_release(ServeRequest(
        input_len=input_len,
        output_len=output_len,
        request_rate_per_s=opts.request_rate,
        num_prompts=opts.num_prompts,
        max_concurrency=opts.max_concurrency,
        dataset=opts.dataset,
        dataset_lengths=lengths,
        dataset_line_numbers=line_numbers,
        random_range_ratio=opts.random_range_ratio,
        burstiness=opts.burstiness,
        batch=opts.batch,
        max_model_len=opts.max_model_len,
        gpu_memory_utilization=opts.gpu_memory_utilization,
        kv_cache_dtype=opts.kv_cache_dtype.value,
        moe_backend=opts.moe_backend.value,
        all2all_backend=opts.all2all_backend.value,
        enable_dbo=opts.enable_dbo,
        async_scheduling=opts.async_scheduling,
        prompt_tokenizer=None if opts.prompt_tokenizer is PromptTokenizerChoice.auto else opts.prompt_tokenizer.value,
        tokenizer_workers=opts.renderer_num_workers,
        quantization_override=quantization_override,
        checkpoint_dtype=checkpoint_dtype,
        max_num_batched_tokens=opts.max_num_batched_tokens,
        num_gpus=opts.gpus,
        layout=parse_layout(opts.layout),
        objective=opts.objective.value,
        max_tpot_seconds=None if opts.max_tpot_ms is None else units.ms_to_seconds(opts.max_tpot_ms),
        max_ttft_seconds=None if opts.max_ttft_ms is None else units.ms_to_seconds(opts.max_ttft_ms),
        max_e2e_seconds=None if opts.max_e2e_ms is None else units.ms_to_seconds(opts.max_e2e_ms),
        engine_versions=parse_engine_versions(opts.engine_version),
        mode=opts.mode.value,
        expert_imbalance=check_expert_imbalance(opts.expert_imbalance),
        speculation=None if model is None else speculation(opts, model),
    ))


def check_expert_imbalance(value: float | None) -> float | None:
    if value is not None and not 1.0 <= value <= 64.0:
        raise SpecError(f"--expert-imbalance: {value} must be between 1 (every GPU as busy) and 64 "
                        "(the busiest GPU's routed tokens over the mean)")
    return value


def train_request(opts: PlanOptions) -> TrainRequest:
    layout = parse_layout(opts.layout, training=True)
    if opts.global_batch is None:
        raise SpecError("--global-batch: required for --workload train (sequences per step)")
    if opts.seq_len is None:
        raise SpecError("--seq-len: required for --workload train (tokens per sequence)")
    return TrainRequest(
        global_batch=opts.global_batch,
        seq_len=opts.seq_len,
        num_gpus=opts.gpus,
        layout=layout,
        micro_batch=opts.micro_batch,
        schedule=_value(opts.schedule),
        virtual_stages=opts.virtual_stages,
        recompute=_value(opts.recompute),
        recompute_num_layers=opts.recompute_num_layers,
        sequence_parallel=opts.sequence_parallel,
        zero_stage=opts.zero,
        attention=opts.attention.value,
        attention_kernel=opts.attention_kernel.value,
        precision=TrainRequest.precision if opts.precision is None else opts.precision.value,
        bf16_asked=opts.precision == Precision.bf16,
        fp8_recipe=_value(opts.fp8_recipe),
        tp_comm_overlap=opts.tp_comm_overlap,
        moe_comm_overlap=opts.moe_comm_overlap,
        moe_dispatcher=opts.moe_dispatcher.value,
        moe_host_seconds=None if opts.moe_host_ms is None else units.ms_to_seconds(opts.moe_host_ms),
        mtp_layers=opts.mtp_layers,
        grad_reduce=opts.grad_reduce.value,
        optimizer_states=opts.optimizer_states.value,
        engine_versions=parse_engine_versions(opts.engine_version),
        expert_imbalance=check_expert_imbalance(opts.expert_imbalance),
        engine=opts.engine.value,
    )


def load_specs(opts: PlanOptions):
    """The model (with --quantization applied), the cluster, and the serving request's
    quantization_override."""
    if opts.model is None or opts.cluster is None:
        missing = "--model" if opts.model is None else "--cluster"
        raise SpecError(f"plan: {missing}: required (try `plan --help`, `plan models`, `plan clusters`)")
    from planner.catalog import checkpoint_config, resolve_cluster, resolve_model

    model_spec = resolve_model(opts.model)
    override = None
    if opts.quantization is not None:
        wanted = None if opts.quantization is QuantChoice.none else opts.quantization.value
        check_checkpoint_quantization(opts.model, model_spec, wanted, checkpoint_config)
        if wanted is not None and wanted != model_spec.quantization:
            override = wanted  # the engine must quantize a 16-bit checkpoint itself
        if wanted != model_spec.quantization:
            # another checkpoint (16-bit, or one the engine quantizes on load): the spec's
            # mixed-precision layout (an NVFP4 checkpoint's FP8 attention and NVFP4 LM head,
            # gpt-oss's experts-only MXFP4) was its checkpoint's, not this one's
            model_spec = model_spec.model_copy(update={
                "quantization": wanted, "quantization_scope": "all", "secondary_quantization": None,
                "lm_head_quantization": None, "quantization_block_size": None,
                "checkpoint_kv_cache_dtype": None})  # nor its quantization config's KV format
            if (problem := model_spec.int4_group_problem()) is not None:
                raise SpecError(f"--quantization {wanted}: {problem} of {model_spec.name}")
    cluster_spec = resolve_cluster(opts.cluster)
    if opts.gpus is not None and not 1 <= opts.gpus <= cluster_spec.num_gpus:
        raise SpecError(f"--gpus: {opts.gpus} is outside 1..{cluster_spec.num_gpus} (the cluster's GPUs)")
    return model_spec, cluster_spec, override


def check_checkpoint_quantization(arg: str, model: ModelSpec, wanted: str | None, checkpoint_config) -> None:
    """--quantization against a quantized checkpoint's own config.json: the command serves that
    checkpoint, so another method is refused by the engine (vLLM 0.33.0 ModelConfig._verify_quantization:
    "Quantization method specified in the model config ... does not match"), and none plans 16-bit
    weights the checkpoint does not have; a shipped or YAML spec stays a what-if (MODEL is the
    user's to pick, and the notes say which checkpoint it must be)."""
    config = checkpoint_config(arg)
    if config is None or model.quantization is None or wanted == model.quantization:
        return
    asked = "none" if wanted is None else wanted
    raise SpecError(f"{config}: quantization_config: the checkpoint's weights are {model.quantization} already; "
                    f"--quantization {asked} plans another checkpoint than the one the command serves "
                    + ("(vLLM 0.33.0 refuses a method other than the checkpoint's)" if wanted is not None
                       else "(its quantized weights load as they are)")
                    + "; drop --quantization, or give the 16-bit checkpoint's config.json")


def check_engine_versions(opts: PlanOptions) -> None:
    """--engine-version naming only engines the workload does not run would be ignored: a
    one-line error, as for every other flag the workload ignores (one naming any engine it
    runs is a set for both workloads, and stands)."""
    if opts.engine_version == DEFAULT_ENGINE_VERSION:
        return
    parse_engine_versions(opts.engine_version)  # its syntax first: "=0.22.0" named a blank engine below
    named = {part.partition("=")[0].strip() for part in opts.engine_version.split(",") if part.strip()}
    if opts.workload is Workload.train:
        used = {"megatron"} if opts.engine.value == "megatron" else set()
        runs = f"--engine {opts.engine.value}" + ("" if used else ", whose release is fixed")
    else:
        used, runs = {"vllm", "sglang"}, "vLLM or SGLang"
    if named and not named & used:
        raise SpecError(f"--engine-version: {', '.join(sorted(named))} not used by a {opts.workload.value} plan "
                        f"(it runs {runs}); drop it")


def request_for(opts: PlanOptions):
    """Specs and the request of the chosen workload (checks in the order a user reads them)."""
    check_engine_versions(opts)
    model_spec, cluster_spec, override = load_specs(opts)
    if opts.expert_imbalance is not None and not model_spec.is_moe:
        raise SpecError(f"--expert-imbalance: {model_spec.name} has no routed experts")
    if opts.expert_imbalance is not None:
        from planner.cost.moe import most_expert_load_factor

        most_factor = most_expert_load_factor(model_spec)  # cost/moe.expert_load_factor caps it at ep too
        if opts.expert_imbalance > most_factor:
            raise SpecError(f"--expert-imbalance: {opts.expert_imbalance:g} is more than any GPU can get: "
                            f"{model_spec.name}'s tokens each pick {model_spec.num_experts_per_tok} of "
                            f"{model_spec.num_local_experts} experts, so the busiest GPU takes at most "
                            f"{most_factor:g} x the mean (E / k)")
    if opts.workload is Workload.train:
        gpn = cluster_spec.gpus_per_node
        if opts.gpus is not None and opts.gpus > gpn and opts.gpus % gpn:
            raise SpecError(f"--gpus: {opts.gpus} does not fill whole nodes of {gpn}: a training launch starts "
                            f"the same --nproc-per-node on every node; give a multiple of {gpn} (or {gpn} or fewer)")
        request = train_request(opts)
        if model_spec.position_embedding == "learned" and request.seq_len > model_spec.max_position_embeddings:
            # the command would build a larger position table: another model than the spec's
            raise SpecError(f"--seq-len: {request.seq_len:,} exceeds {model_spec.name}'s "
                            f"{model_spec.max_position_embeddings:,} learned positions (max_position_embeddings: "
                            f"its position table has no rows beyond them)")
        return model_spec, cluster_spec, request
    checkpoint_dtype = None
    if model_spec.dtype == "float32":  # served in 16 bits, as the engines do (served_dtype)
        checkpoint_dtype = "float32"
        model_spec = model_spec.model_copy(update={"dtype": served_dtype(cluster_spec.gpu)})
    return model_spec, cluster_spec, serve_request(opts, override, model_spec, checkpoint_dtype)


def exit_with(run: Callable[[], int]) -> NoReturn:
    """Run a command; a SpecError becomes one line on stderr and exit code 2. A closed pipe
    (`plan ... | head`) is quiet: the consoles stop writing and the command's own code
    stands (0 for a plan); output that cannot be written (a full disk) is one line, exit 2."""
    from planner.render.common import discard_stream, finish_output

    try:
        code = run()
    except SpecError as exc:
        typer.echo(str(exc).replace("\n", " "), err=True)
        raise typer.Exit(2) from None
    except BrokenPipeError:
        discard_stream(sys.stdout)
        raise typer.Exit(0) from None
    except OSError as exc:  # inputs are read into SpecErrors: this is writing the output
        discard_stream(sys.stdout)
        _write_failed(exc.strerror or str(exc))
    problem = finish_output()
    if problem is not None:
        _write_failed(problem)
    raise typer.Exit(code)


def _write_failed(problem: str) -> NoReturn:
    typer.echo(f"plan: cannot write the output: {problem}", err=True)
    raise typer.Exit(2)


SERVE_ONLY = ("objective", "mode", "max_tpot_ms", "max_ttft_ms", "max_e2e_ms", "request_rate", "num_prompts",
              "max_concurrency", "random_range_ratio", "burstiness", "dataset", "input_len", "output_len", "batch", "max_model_len",
              "gpu_memory_utilization", "kv_cache_dtype", "moe_backend", "all2all_backend", "enable_dbo", "async_scheduling", "prompt_tokenizer", "renderer_num_workers", "quantization", "max_num_batched_tokens",
              "served_model", "speculative_method", "num_speculative_tokens", "draft_acceptance", "draft_model",
              "served_draft_model", "frontier")
BURST_ONLY = ("num_prompts", "random_range_ratio", "burstiness")
"""What only the simulated burst reads (--dataset also sets the planned mean lengths; a finite
--request-rate and --max-concurrency set the steady state's load, so `plan explain` takes them;
--request-rate inf only starts a burst)."""
FRONTIER_IGNORES = ("objective", "top", "show_rejected", "served_model", "served_draft_model")
"""Flags --frontier has no use for: it sweeps both objectives' ends and prints no layouts table
or command."""
TRAIN_ONLY = ("global_batch", "seq_len", "micro_batch", "schedule", "virtual_stages", "recompute", "recompute_num_layers",
              "sequence_parallel", "zero", "attention", "attention_kernel", "precision", "fp8_recipe", "tp_comm_overlap", "moe_comm_overlap", "engine",
              "grad_reduce", "optimizer_states", "moe_dispatcher", "moe_host_ms", "mtp_layers")
TIMELINE_ONLY = ("stages", "micro_batches", "forward_only")
TIMELINE_USES = (*TIMELINE_ONLY, "schedule", "virtual_stages", "json_output", "svg", "html", "timeline_only")
SERVE_ENGINES = (Emit.vllm, Emit.vllm_ray, Emit.sglang)
TRAIN_LAUNCHERS = (Emit.megatron, Emit.torchtitan)


def given_flags(ctx: typer.Context) -> dict[str, str]:
    """Parameter name -> the flag as typed, for what the command line (or the environment)
    set rather than a default."""
    given = {}
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT") and param.opts:
            negated = getattr(param, "secondary_opts", None) and ctx.params.get(param.name) is False
            given[param.name] = param.secondary_opts[0] if negated else param.opts[0]
    return given


def check_flags_used(ctx: typer.Context, workload: Workload, emit: Emit | None = None,
                     timeline_only: bool | None = None) -> None:
    """A flag the chosen workload (or --timeline-only) ignores is refused, not dropped:
    `--workload train --batch 64` would otherwise plan as if it were not there."""
    given = given_flags(ctx)
    if timeline_only:
        unused = [flag for name, flag in given.items() if name not in TIMELINE_USES]
        if unused:
            raise SpecError(f"{unused[0]}: not used by --timeline-only (it draws --schedule, --stages, "
                            f"--micro-batches, --virtual-stages)")
        return
    if timeline_only is False:
        for name in TIMELINE_ONLY:
            if name in given:
                raise SpecError(f"{given[name]}: only with --timeline-only")
    if "dataset" in given:
        for name in ("input_len", "output_len"):
            if name in given:
                raise SpecError(f"{given[name]}: the lengths come from --dataset (its means are planned "
                                f"for); give one or the other")
    other, unused = ("serve", SERVE_ONLY) if workload is Workload.train else ("train", TRAIN_ONLY)
    for name in unused:
        if name in given:
            raise SpecError(f"{given[name]}: a --workload {other} option; --workload {workload.value} "
                            f"would ignore it")
    if emit in TRAIN_LAUNCHERS and workload is Workload.serve:
        raise SpecError(f"--emit {emit.value}: a training launcher; serving emits vllm, vllm-ray or sglang")
    if emit in SERVE_ENGINES and workload is Workload.train:
        raise SpecError(f"--emit {emit.value}: a serving engine; training emits megatron or torchtitan")


def check_saved_outputs(json_output: bool, svg: str | None, html: str | None) -> None:
    """--svg/--html save the printed report: refused with --json (nothing is drawn, so no file
    would be written) and when both name one file (the second would overwrite the first)."""
    saved = [flag for flag, path in (("--svg", svg), ("--html", html)) if path is not None]
    if json_output and saved:
        raise SpecError(f"{saved[0]}: saves the printed report, and --json prints none (redirect the JSON instead)")
    if svg is not None and html is not None and Path(svg).resolve() == Path(html).resolve():
        raise SpecError(f"--html: {html} is also the --svg file; give each its own path")


def _version(value: bool) -> None:
    if value:
        typer.echo(f"plan (parallel-planner) {__version__}")
        raise typer.Exit(0)


@app.callback(invoke_without_command=True)
def plan(
    ctx: typer.Context,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    workload: WorkloadOpt = Workload.serve,
    gpus: GpusOpt = None,
    layout: LayoutOpt = None,
    objective: ObjectiveOpt = DEFAULT_OBJECTIVE,
    max_tpot_ms: MaxTpotMsOpt = None,
    max_ttft_ms: MaxTtftMsOpt = None,
    max_e2e_ms: MaxE2eMsOpt = None,
    mode: ModeOpt = DEFAULT_MODE,
    top: Annotated[int | None, typer.Option(min=1, help=f"Rows to show (default {DEFAULT_TOP_ROWS}; --json: every layout unless given).")] = None,
    json_output: JsonOpt = False,
    show_rejected: Annotated[bool, typer.Option(help="List every rejected layout with its reasons.")] = False,
    emit: Annotated[Emit | None, typer.Option(help="Launch command to print (default: vllm for serve, the --engine for train).")] = None,
    input_len: InputLenOpt = ServeRequest.input_len,
    output_len: OutputLenOpt = ServeRequest.output_len,
    batch: BatchOpt = None,
    max_model_len: MaxModelLenOpt = None,
    gpu_memory_utilization: GpuMemoryUtilizationOpt = ServeRequest.gpu_memory_utilization,
    kv_cache_dtype: KvCacheDtypeOpt = DEFAULT_KV_CACHE_DTYPE,
    moe_backend: MoeBackendOpt = DEFAULT_MOE_BACKEND,
    all2all_backend: All2AllBackendOpt = DEFAULT_ALL2ALL_BACKEND,
    enable_dbo: EnableDboOpt = False,
    async_scheduling: AsyncSchedulingOpt = None,
    prompt_tokenizer: PromptTokenizerOpt = PromptTokenizerChoice.auto,
    renderer_num_workers: RendererNumWorkersOpt = 1,
    speculative_method: SpeculativeMethodOpt = None,
    num_speculative_tokens: NumSpeculativeTokensOpt = None,
    draft_acceptance: DraftAcceptanceOpt = None,
    draft_model: DraftModelOpt = None,
    served_draft_model: ServedDraftModelOpt = DRAFT_MODEL_PLACEHOLDER,
    quantization: QuantizationOpt = None,
    max_num_batched_tokens: MaxNumBatchedTokensOpt = None,
    expert_imbalance: ExpertImbalanceOpt = None,
    request_rate: RequestRateOpt = None,
    num_prompts: NumPromptsOpt = None,
    max_concurrency: MaxConcurrencyOpt = None,
    random_range_ratio: RandomRangeRatioOpt = None,
    burstiness: BurstinessOpt = None,
    dataset: DatasetOpt = None,
    global_batch: GlobalBatchOpt = None,
    seq_len: SeqLenOpt = None,
    micro_batch: MicroBatchOpt = None,
    schedule: ScheduleOpt = None,
    virtual_stages: VirtualStagesOpt = None,
    recompute: RecomputeOpt = None,
    recompute_num_layers: RecomputeNumLayersOpt = None,
    sequence_parallel: SequenceParallelOpt = None,
    zero: ZeroOpt = None,
    attention: AttentionOpt = DEFAULT_ATTENTION,
    attention_kernel: AttentionKernelOpt = DEFAULT_ATTENTION_KERNEL,
    precision: PrecisionOpt = None,
    fp8_recipe: Fp8RecipeOpt = None,
    tp_comm_overlap: TpCommOverlapOpt = True,
    moe_comm_overlap: MoeCommOverlapOpt = True,
    moe_dispatcher: MoeDispatcherOpt = MoeDispatcherChoice.auto,
    moe_host_ms: MoeHostMsOpt = None,
    mtp_layers: MtpLayersOpt = None,
    grad_reduce: GradReduceOpt = GradReduce.fp32,
    optimizer_states: OptimizerStatesOpt = OptimizerStates.fp32,
    engine: EngineOpt = DEFAULT_ENGINE,
    engine_version: EngineVersionOpt = DEFAULT_ENGINE_VERSION,
    served_model: Annotated[str, typer.Option(help="Model argument written into launch commands (path or HF id).")] = MODEL_PLACEHOLDER,
    frontier: Annotated[bool, typer.Option("--frontier", help="Serve: trace output tok/s per GPU against tok/s per user "
                                           "over a sweep of TPOT limits, aggregated and disaggregated (the Pareto frontier).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")] = False,
) -> None:
    """Plan a model on a cluster (the main job)."""
    if ctx.invoked_subcommand is not None:
        early = [flag for name, flag in given_flags(ctx).items() if name != "version"]
        if early:  # `plan --json explain ...` would otherwise drop --json without a word
            raise SpecError(f"{early[0]}: given before the subcommand `{ctx.invoked_subcommand}`, which does not "
                            f"read it; put options after the subcommand's name (plan {ctx.invoked_subcommand} ...)")
        return
    opts = PlanOptions(
        model=model, cluster=cluster, workload=workload, gpus=gpus, layout=layout,
        objective=objective, max_tpot_ms=max_tpot_ms, max_ttft_ms=max_ttft_ms, max_e2e_ms=max_e2e_ms,
        json_output=json_output,
        input_len=input_len, output_len=output_len, batch=batch, max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype, moe_backend=moe_backend,
        all2all_backend=all2all_backend, enable_dbo=enable_dbo, async_scheduling=async_scheduling,
        prompt_tokenizer=prompt_tokenizer, renderer_num_workers=renderer_num_workers, quantization=quantization, max_num_batched_tokens=max_num_batched_tokens,
        request_rate=request_rate, num_prompts=num_prompts, max_concurrency=max_concurrency, dataset=dataset,
        random_range_ratio=random_range_ratio, burstiness=burstiness,
        global_batch=global_batch, seq_len=seq_len, micro_batch=micro_batch, schedule=schedule,
        virtual_stages=virtual_stages, recompute=recompute, recompute_num_layers=recompute_num_layers,
        sequence_parallel=sequence_parallel,
        zero=zero, attention=attention, attention_kernel=attention_kernel, precision=precision, fp8_recipe=fp8_recipe, tp_comm_overlap=tp_comm_overlap, moe_comm_overlap=moe_comm_overlap,
        moe_dispatcher=moe_dispatcher, moe_host_ms=moe_host_ms, mtp_layers=mtp_layers, grad_reduce=grad_reduce,
        optimizer_states=optimizer_states,
        engine_version=engine_version, mode=mode,
        expert_imbalance=expert_imbalance, engine=engine,
        speculative_method=speculative_method, num_speculative_tokens=num_speculative_tokens,
        draft_acceptance=draft_acceptance, draft_model=draft_model, served_draft_model=served_draft_model,
    )
    def run() -> int:
        check_flags_used(ctx, workload, emit)
        if emit is Emit.vllm_ray and mode is Mode.disaggregated:
            raise SpecError("--emit vllm-ray: the disaggregated servers are launched with vLLM's own multi-node "
                            "flags, without Ray (give --emit vllm)")
        if frontier:
            return run_frontier(opts, emit, given_flags(ctx))
        given = given_flags(ctx)
        engine_opts = launcher_engine(opts, emit, "engine" in given)
        return run_plan(engine_opts, top=top, show_rejected=show_rejected, emit=emit, served_model=served_model,
                        moe_flags_asked=moe_flags_asked(given))

    exit_with(run)


def run_frontier(opts: PlanOptions, emit: Emit | None, given: dict[str, str]) -> int:
    """--frontier: the sweep, or (nothing fits at all) the plain plan, which says why."""
    for name in FRONTIER_IGNORES:
        if name in given:
            raise SpecError(f"{given[name]}: not used by --frontier (it sweeps the TPOT limit and prints no "
                            f"layouts table or command)")
    model_spec, cluster_spec, request = request_for(opts)
    from planner.serve_cli import run_frontier_serve

    return run_frontier_serve(model_spec, cluster_spec, request, json_output=opts.json_output,
                              engine=(emit or Emit.vllm).value)


def moe_flags_asked(given: dict[str, str]) -> tuple[str, ...]:
    """The MoE-only training flags typed: --moe-comm-overlap (its --no- form turns something
    off, harmless without experts), --moe-dispatcher and --moe-host-ms."""
    asked = ("--moe-comm-overlap",) if given.get("moe_comm_overlap") == "--moe-comm-overlap" else ()
    return asked + tuple(flag for name, flag in (("moe_dispatcher", "--moe-dispatcher"), ("moe_host_ms", "--moe-host-ms"))
                         if name in given)


def check_moe_flags_asked(model: ModelSpec, asked: tuple[str, ...]) -> None:
    """An MoE-only flag typed for a model without experts would be silently ignored: refused."""
    if asked and not model.is_moe:
        raise SpecError(f"{asked[0]}: {model.name} has no experts (the MoE layers' settings are for MoE models)")


def launcher_engine(opts: PlanOptions, emit: Emit | None, engine_given: bool) -> PlanOptions:
    """A training launcher prints the engine the plan was priced for: `--emit torchtitan` alone
    plans under torchtitan's rules (as `--engine torchtitan`); an --emit that names the other
    engine than --engine is refused (its config would not be the plan's)."""
    if opts.workload is not Workload.train or emit not in TRAIN_LAUNCHERS:
        return opts
    wanted = Engine(emit.value)
    if not engine_given:
        return replace(opts, engine=wanted)
    if opts.engine is not wanted:
        raise SpecError(f"--emit {emit.value}: the plan is priced under --engine {opts.engine.value}'s rules; "
                        f"emit {opts.engine.value}, or plan with --engine {emit.value}")
    return opts


def run_plan(opts: PlanOptions, *, top: int | None, show_rejected: bool, emit: Emit | None,
             served_model: str, moe_flags_asked: tuple[str, ...] = ()) -> int:
    check_served_model(served_model)
    model_spec, cluster_spec, request = request_for(opts)
    check_moe_flags_asked(model_spec, moe_flags_asked)
    if isinstance(request, TrainRequest):
        from planner.train_cli import run_train

        return run_train(model_spec, cluster_spec, request, json_output=opts.json_output, top=top,
                         show_rejected=show_rejected, emit=(emit.value if emit else request.engine))
    from planner.serve_cli import run_serve

    return run_serve(model_spec, cluster_spec, request, json_output=opts.json_output, top=top,
                     show_rejected=show_rejected, emit=(emit or Emit.vllm).value,
                     served_model=served_model)


def check_served_model(served_model: str, flag: str = "--served-model") -> None:
    """--served-model goes into the launch command as one argument: an empty or blank name, or
    one with a control character (a newline would split the printed command), launches nothing;
    nor does one that starts with a dash, which the engine's argument parser reads as an option
    (`vllm serve --foo`: an unknown flag; write a path as ./-foo)."""
    if not served_model.strip():
        raise SpecError(f"{flag}: empty; give the model path or Hugging Face id the command should load")
    if served_model.lstrip().startswith("-"):
        raise SpecError(f"{flag}: {served_model!r} starts with '-', which the engine would read as an option "
                        f"(write a path as ./{served_model.lstrip()})")
    if any(not ch.isprintable() for ch in served_model):
        raise SpecError(f"{flag}: {served_model!r} contains a control character")


@app.command()
def models() -> None:
    """List the shipped model specs."""
    from planner.render.catalog import render_models

    render_models()


@app.command()
def clusters() -> None:
    """List the shipped hardware profiles."""
    from planner.render.catalog import render_clusters

    render_clusters()


@app.command()
def gpus() -> None:
    """List the GPU catalog (dense peaks; blank = unknown)."""
    from planner.render.catalog import render_gpus

    render_gpus()


@app.command()
def explain(
    ctx: typer.Context,
    model: ModelOpt = None,
    cluster: ClusterOpt = None,
    workload: WorkloadOpt = Workload.serve,
    gpus: GpusOpt = None,
    layout: LayoutOpt = None,
    objective: ObjectiveOpt = DEFAULT_OBJECTIVE,
    max_tpot_ms: MaxTpotMsOpt = None,
    max_ttft_ms: MaxTtftMsOpt = None,
    max_e2e_ms: MaxE2eMsOpt = None,
    mode: ModeOpt = DEFAULT_MODE,
    json_output: JsonOpt = False,
    input_len: InputLenOpt = ServeRequest.input_len,
    output_len: OutputLenOpt = ServeRequest.output_len,
    batch: BatchOpt = None,
    max_model_len: MaxModelLenOpt = None,
    gpu_memory_utilization: GpuMemoryUtilizationOpt = ServeRequest.gpu_memory_utilization,
    kv_cache_dtype: KvCacheDtypeOpt = DEFAULT_KV_CACHE_DTYPE,
    moe_backend: MoeBackendOpt = DEFAULT_MOE_BACKEND,
    all2all_backend: All2AllBackendOpt = DEFAULT_ALL2ALL_BACKEND,
    enable_dbo: EnableDboOpt = False,
    async_scheduling: AsyncSchedulingOpt = None,
    prompt_tokenizer: PromptTokenizerOpt = PromptTokenizerChoice.auto,
    renderer_num_workers: RendererNumWorkersOpt = 1,
    speculative_method: SpeculativeMethodOpt = None,
    num_speculative_tokens: NumSpeculativeTokensOpt = None,
    draft_acceptance: DraftAcceptanceOpt = None,
    draft_model: DraftModelOpt = None,
    served_draft_model: ServedDraftModelOpt = DRAFT_MODEL_PLACEHOLDER,
    quantization: QuantizationOpt = None,
    max_num_batched_tokens: MaxNumBatchedTokensOpt = None,
    expert_imbalance: ExpertImbalanceOpt = None,
    request_rate: RequestRateOpt = None,
    num_prompts: NumPromptsOpt = None,
    max_concurrency: MaxConcurrencyOpt = None,
    random_range_ratio: RandomRangeRatioOpt = None,
    burstiness: BurstinessOpt = None,
    dataset: DatasetOpt = None,
    global_batch: GlobalBatchOpt = None,
    seq_len: SeqLenOpt = None,
    micro_batch: MicroBatchOpt = None,
    schedule: ScheduleOpt = None,
    virtual_stages: VirtualStagesOpt = None,
    recompute: RecomputeOpt = None,
    recompute_num_layers: RecomputeNumLayersOpt = None,
    sequence_parallel: SequenceParallelOpt = None,
    zero: ZeroOpt = None,
    attention: AttentionOpt = DEFAULT_ATTENTION,
    attention_kernel: AttentionKernelOpt = DEFAULT_ATTENTION_KERNEL,
    precision: PrecisionOpt = None,
    fp8_recipe: Fp8RecipeOpt = None,
    tp_comm_overlap: TpCommOverlapOpt = True,
    moe_comm_overlap: MoeCommOverlapOpt = True,
    moe_dispatcher: MoeDispatcherOpt = MoeDispatcherChoice.auto,
    moe_host_ms: MoeHostMsOpt = None,
    mtp_layers: MtpLayersOpt = None,
    grad_reduce: GradReduceOpt = GradReduce.fp32,
    optimizer_states: OptimizerStatesOpt = OptimizerStates.fp32,
    engine: EngineOpt = DEFAULT_ENGINE,
    engine_version: EngineVersionOpt = DEFAULT_ENGINE_VERSION,
    svg: Annotated[str | None, typer.Option(help="Also save what was printed as SVG.")] = None,
    html: Annotated[str | None, typer.Option(help="Also save what was printed as HTML.")] = None,
    sensitivity: Annotated[bool, typer.Option("--sensitivity/--no-sensitivity", help="Re-plan with inputs moved +/-20%.")] = True,
    emit: Annotated[Emit | None, typer.Option(help="Serve: the engine the explained plan is for, vllm (default) or sglang (SGLang's KV pool and the layouts it launches, as `plan --emit sglang` ranks them).")] = None,
    timeline_only: Annotated[bool, typer.Option("--timeline-only", help="Only draw a pipeline schedule (--schedule, --stages, --micro-batches).")] = False,
    stages: Annotated[int, typer.Option(help="--timeline-only: pipeline stages.")] = 4,
    micro_batches: Annotated[int, typer.Option(help="--timeline-only: micro-batches.")] = 4,
    forward_only: Annotated[bool, typer.Option("--forward-only", help="--timeline-only: forwards only (gpipe; the 4-stage, 4-micro-batch forward-only example takes 7 units).")] = False,
) -> None:
    """One layout in depth: placement, memory, collectives, timeline, time, how sure we are."""
    from planner.explain_cli import run_explain, run_explain_disaggregated, run_timeline

    if timeline_only:
        def timeline() -> int:
            check_flags_used(ctx, workload, timeline_only=True)
            check_saved_outputs(json_output, svg, html)
            return run_timeline(_value(schedule), stages, micro_batches, virtual_stages, forward_only,
                                json_output, svg, html)

        exit_with(timeline)
    opts = PlanOptions(
        model=model, cluster=cluster, workload=workload, gpus=gpus, layout=layout,
        objective=objective, max_tpot_ms=max_tpot_ms, max_ttft_ms=max_ttft_ms, max_e2e_ms=max_e2e_ms,
        json_output=json_output,
        input_len=input_len, output_len=output_len, batch=batch, max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization, kv_cache_dtype=kv_cache_dtype, moe_backend=moe_backend,
        all2all_backend=all2all_backend, enable_dbo=enable_dbo, async_scheduling=async_scheduling,
        prompt_tokenizer=prompt_tokenizer, renderer_num_workers=renderer_num_workers, quantization=quantization, max_num_batched_tokens=max_num_batched_tokens,
        request_rate=request_rate, num_prompts=num_prompts, max_concurrency=max_concurrency, dataset=dataset,
        random_range_ratio=random_range_ratio, burstiness=burstiness,
        global_batch=global_batch, seq_len=seq_len, micro_batch=micro_batch, schedule=schedule,
        virtual_stages=virtual_stages, recompute=recompute, recompute_num_layers=recompute_num_layers,
        sequence_parallel=sequence_parallel,
        zero=zero, attention=attention, attention_kernel=attention_kernel, precision=precision, fp8_recipe=fp8_recipe, tp_comm_overlap=tp_comm_overlap, moe_comm_overlap=moe_comm_overlap,
        moe_dispatcher=moe_dispatcher, moe_host_ms=moe_host_ms, mtp_layers=mtp_layers, grad_reduce=grad_reduce,
        optimizer_states=optimizer_states,
        engine_version=engine_version, mode=mode,
        expert_imbalance=expert_imbalance, engine=engine,
        speculative_method=speculative_method, num_speculative_tokens=num_speculative_tokens,
        draft_acceptance=draft_acceptance, draft_model=draft_model, served_draft_model=served_draft_model,
    )
    def run() -> int:
        check_flags_used(ctx, workload, emit, timeline_only=False)
        if emit is not None and emit not in (Emit.vllm, Emit.sglang):
            raise SpecError(f"--emit {emit.value}: plan explain takes a serving engine, vllm or sglang "
                            f"(training explains the --engine's plan)")
        engine = "sglang" if emit is Emit.sglang else "vllm"
        given = given_flags(ctx)
        burst_only = [*BURST_ONLY, *(["request_rate"] if request_rate is not None and request_rate == float("inf") else [])]
        for name in burst_only:
            if name in given:
                raise SpecError(f"{given[name]}: plan explain takes one layout apart in the steady state; the "
                                f"burst's metrics (what vllm bench serve reports) come from `plan` itself")
        check_saved_outputs(json_output, svg, html)
        if mode is Mode.disaggregated:  # check_flags_used refused it for --workload train
            return run_explain_disaggregated(*request_for(opts), json_output=json_output, svg=svg, html=html,
                                             engine=engine)
        return run_explain(*request_for(opts), json_output=json_output, svg=svg, html=html,
                           sensitivity_runs=sensitivity, engine=engine)

    exit_with(run)


def _register_probe() -> None:
    from planner.probe.command import register

    register(app)


_register_probe()


def main() -> None:
    """Console entry point: one line and exit 2 for every user mistake, never a traceback."""
    try:
        code = app(standalone_mode=False)
    except SpecError as exc:
        _exit_one_line(str(exc), 2)
    except typer.TyperException as exc:  # typer's usage errors: unknown option, bad value, ...
        _exit_one_line(f"plan: {exc.format_message()}", 2)
    except KeyboardInterrupt:
        _exit_one_line("plan: interrupted", 130)
    except BrokenPipeError:
        from planner.render.common import discard_stream

        discard_stream(sys.stdout)
        sys.exit(0)
    except OSError as exc:  # `plan gpus > /dev/full`
        from planner.render.common import discard_stream

        discard_stream(sys.stdout)
        _exit_one_line(f"plan: cannot write the output: {exc.strerror or exc}", 2)
    from planner.render.common import finish_output

    problem = finish_output()
    if problem is not None:
        _exit_one_line(f"plan: cannot write the output: {problem}", 2)
    sys.exit(code if isinstance(code, int) else 0)


def _exit_one_line(message: str, code: int) -> NoReturn:
    typer.echo(message.replace("\n", " "), err=True)
    sys.exit(code)

