"""The engine releases the planner targets: one row per release, with the facts the cost model
and the emitters need, each read from that release's own source (named in `source`).

Pure data and one parser; imports nothing from the planner but errors, so the cost model
(planner/cost/) and the emitters (planner/emit/) both read it without depending on each other.
`--engine-version vllm=0.33.0,sglang=0.5.10.post1,megatron=core_v0.14.0` picks rows; an engine
left out keeps its default, the newest release whose source was read.

How each row was read (regenerate the flag lists with tools/engine_flags.py):
- vLLM: the release wheel from PyPI (`vllm/_version.py` names the commit); vllm/engine/arg_utils.py
  (EngineArgs.add_cli_args, get_batch_defaults, _set_default_args, create_engine_config),
  vllm/config/parallel.py, vllm/model_executor/layers/quantization/__init__.py,
  vllm/model_executor/layers/quantization/fp8.py (online fp8 deprecation).
  0.6.6.post1, the V0 engine: vllm/engine/arg_utils.py, vllm/config.py (SchedulerConfig,
  ModelConfig), vllm/worker/worker.py (determine_num_available_blocks, initialize_cache),
  vllm/worker/model_runner.py (profile_run).
- SGLang: the release wheel from PyPI; python/sglang/srt/server_args.py (ServerArgs.add_cli_args,
  _handle_gpu_memory_settings, check_server_args), python/sglang/cli/main.py (`sglang serve`);
  0.5.23: the flags are fields of sglang/srt/arg_groups/fields/*.py, the checks in
  sglang/srt/arg_groups/validation_hook.py and memory_hook.py.
  The router: sgl-router/py_src/sglang_router/router_args.py (RouterArgs.add_cli_args).
- Megatron-LM: git tags of NVIDIA/Megatron-LM; megatron/training/arguments.py (validate_args),
  megatron/core/transformer/transformer_config.py (__post_init__).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from planner.errors import SpecError

BATCHED_DP_MOE_MAX_NUM_BATCHED_TOKENS = 256
"""vLLM's default token budget per step under the low-latency DeepEP backend with EP over DP
ranks: SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS_FOR_BATCHED_DP (vllm/config/scheduler.py
at 0.33.0, set by EngineArgs._set_default_max_num_seqs_and_batched_tokens_args when
ParallelConfig.use_batched_dp_moe). FusedMoEConfig.max_num_tokens is the step's budget
(fused_moe/layer.py), the most tokens one rank dispatches per call and what DeepEP's buffers
are sized for (all2all_utils.maybe_make_prepare_finalize): a step is one call."""


@dataclass(frozen=True)
class BatchTier:
    """One branch of vLLM's EngineArgs.get_batch_defaults (the OpenAI server's values): GPUs
    with at least min_memory_gib, whose name contains none of excluded_names, get these."""

    min_memory_gib: float
    excluded_names: tuple[str, ...]
    max_num_batched_tokens: int
    max_num_seqs: int


@dataclass(frozen=True)
class VllmRelease:
    version: str
    source: str
    batch_tiers: tuple[BatchTier, ...]
    """First match wins; the last tier matches every GPU."""
    online_fp8_quantization: str
    """`--quantization` value that quantizes a 16-bit checkpoint to fp8 on load."""
    nixl_pipelined_prefill: bool = False
    """A disaggregated prefill worker may have pipeline stages: 0.33.0's NixlPushConnector writes
    each stage's layers into the pp = 1 decode worker (nixl/base_worker.py, "PP>1 (push mode)");
    0.22.0's NIXL connector (pull only) has no stage handling (kv_connector/v1/nixl/worker.py)."""
    kernel_archs: tuple[tuple[int, int], ...] = ((7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0))
    """The compute capabilities the PyPI wheel's own CUDA kernels are compiled for (SASS in the
    fatbins of vllm/_C*.abi3.so and vllm/_moe_C*.abi3.so, read by tools/wheel_kernel_archs.py):
    0.22.0 and 0.33.0 sm_75 to sm_120 (no sm_70: Volta is gone); 0.6.6.post1 sm_70 to sm_90 only
    (its one PTX is an sm_52 stub), so it has no kernel for a Blackwell GPU. SASS runs on GPUs of
    its major version at or above its minor (sm_80's on an 8.6)."""
    v1_engine: bool = True
    """The V1 engine (vllm/v1/, the default from 0.8.0): the CUDA-graph pool is set aside before
    the KV cache is sized (0.22.0 and 0.33.0: Worker.determine_available_memory subtracts
    profile_cudagraph_memory's estimate, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default
    since 0.21.0; V1 releases before it, 0.10.2 among them, captured into the headroom above
    --gpu-memory-utilization, as V0 does), chunked prefill is always on, and a deployment has data and expert
    parallelism (--data-parallel-size, --enable-expert-parallel), --speculative-config and
    multi-node launches without Ray. False: the V0 engine (0.6.6.post1), which sizes the KV
    cache before it captures CUDA graphs (vllm/worker/worker.py: determine_num_available_blocks,
    then initialize_cache -> _init_cache_engine -> _warm_up_model -> capture_model), turns
    chunked prefill on by default only for long contexts (v0_chunked_prefill_by_default) and has
    none of those flags (vllm/engine/arg_utils.py EngineArgs.add_cli_args)."""
    dp_balancer_read: bool = False
    """Its DP load balancer is the one cost/dp_router.py models (read in 0.33.0's
    vllm/v1/engine/core_client.py: d API servers, each scoring an engine by max(d x its own
    requests in flight, the coordinator's snapshot)); older releases score 4 waiting + running of
    the snapshot alone, not modelled: their simulated bursts keep the exact count."""
    async_scheduling: bool = True
    """Async scheduling is on by default (VllmConfig.__post_init__ at 0.22.0 and 0.33.0 turns
    SchedulerConfig.async_scheduling None into True unless an incompatible option is set); the
    V0 engine of 0.6.6.post1 has none. The step simulation and the steady state price its
    one-step lag on a new request (cost/serving_sim.py, Async scheduling)."""
    async_scheduling_off_for: tuple[str, ...] = ()
    """Speculative methods with which the default turns it off: 0.22.0's `ngram` (neither an
    EAGLE/MTP method nor ngram_gpu); 0.33.0 runs ngram on Model Runner V2, where it stays on."""
    prompt_tokenizer: Literal["serial", "microbatch"] = "serial"
    """How the API server tokenizes text prompts (cost/ingress.py): serial, one prompt at a time
    on one thread (0.33.0: vllm/renderers/base.py, renderer_num_workers 1; 0.6.6.post1:
    vllm/entrypoints/openai/serving_engine.py, ThreadPoolExecutor(max_workers=1)); microbatch,
    AsyncMicrobatchTokenizer's batches of up to 32 after a 2 ms wait (0.22.0:
    vllm/utils/async_utils.py)."""
    kv_cache_dtype_from_checkpoint: bool = True
    """`--kv-cache-dtype auto` takes the KV format a ModelOpt checkpoint's quantization config
    names (ModelSpec.checkpoint_kv_cache_dtype): EngineArgs.create_engine_config calls
    resolve_kv_cache_dtype_string (vllm/utils/torch_utils.py) in 0.17.0, 0.22.0 and 0.33.0; not
    in 0.12.0 or earlier (0.6.6.post1 keeps the model's dtype)."""


def runs_kernels_for(archs: tuple[tuple[int, int], ...], compute_capability: float) -> bool:
    """Whether SASS for one of `archs` runs on a GPU of this compute capability: the same major
    version at or below its minor (CUDA's binary compatibility; sm_90 SASS does not run on a 10.0)."""
    major = int(compute_capability)
    minor = round((compute_capability - major) * 10)
    return any(m == major and n <= minor for m, n in archs)


def arch_words(archs: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"{m}.{n}" for m, n in archs)


@dataclass(frozen=True)
class SglangRelease:
    version: str
    source: str
    launcher: tuple[str, ...]
    """The server's entry point."""
    reserved_min_gib_large_gpu: float
    """_handle_gpu_memory_settings: memory kept out of --mem-fraction-static is at least this
    much on GPUs larger than large_gpu_gib."""
    large_gpu_gib: float
    router_launcher: tuple[str, ...]
    router_source: str
    attn_dp_size_flag: bool = False
    """DP attention as `--attn-dp-size d` (0.5.2x: sglang/srt/arg_groups/fields/parallel.py; the
    old `--dp-size d --enable-dp-attention` is deprecated there, resolved to attn_dp_size = d,
    dp_size = 1), or as `--dp-size d --enable-dp-attention` (False)."""
    moe_runner_marlin: bool = False
    """`--moe-runner-backend marlin` is one of the choices (0.5.23:
    sglang/srt/arg_groups/choices.py MOE_RUNNER_BACKEND_CHOICES; not in 0.5.10.post1's
    server_args.py)."""
    hybrid_swa_architectures: frozenset[str] = frozenset()
    """Architectures (config.json `architectures`) whose sliding-window or chunked layers get a KV
    pool of their own (is_hybrid_swa_model, srt/configs/model_config.py): the full layers keep
    every token of a request, the window layers about the window, the two pools split by
    --swa-full-tokens-ratio (0.8 unless set). Every other model keeps each layer's whole context."""
    swa_eviction_interval: int | None = 128
    """Decode tokens a request's window-layer KV may run past the window before SGLang frees what
    fell out of it (SGLANG_SWA_EVICTION_INTERVAL 128, ScheduleBatch._swa_eviction_trigger at
    0.5.23); None: once every window's worth of decode steps (decode_batch_idx % window == 1,
    ScheduleBatch.maybe_evict_swa at 0.5.10.post1)."""
    swa_lock_trims_to_window: bool = True
    """A running request's prefix-cache lock keeps about one window of its prompt's window-layer
    KV (0.5.23: the tree insert frees what left the window and cuts the leaf to one window), not
    whole prompt chunks back to it (0.5.10.post1's swa_radix_cache.py): emit/sglang.locked_prompt_tokens."""
    swa_request_cap_pool: bool = True
    """Without the radix cache and with --max-running-requests (a disaggregated decode server),
    the window pool is sized from the requests (SWARequestCapPoolConfigurator at 0.5.23), not
    --swa-full-tokens-ratio."""
    pipelined_decode: bool = False
    """A disaggregated decode worker may have pipeline stages: 0.5.23's decode scheduler agrees
    on each step's requests over the stages (sglang/srt/disaggregation/decode.py, PP consensus)
    and its KV receiver pulls each stage's layers from the prefill stage of the same rank, so
    the prefill worker must have as many stages (disaggregation/common/conn.py
    CommonKVReceiver: "Decode pp size should be equal to prefill pp size or 1"). False: not read
    for this release, so not planned."""


@dataclass(frozen=True)
class MegatronRelease:
    version: str
    source: str
    tp_may_exceed_query_groups: bool
    """TransformerConfig.__post_init__: num_query_groups must be a multiple of TP (False), or a
    multiple or a divisor of it (True, from core_v0.16.0)."""
    sqrtsoftplus_router: bool = True
    """--moe-router-score-function sqrtsoftplus (DeepSeek-V4's router): core_v0.19.0's
    TransformerConfig lists it; core_v0.14.0's router knows softmax and sigmoid only
    (moe_utils.topk_routing_with_score_function raises on anything else)."""
    flash_attention_version: bool = True
    """--flash-attention-version pins the FlashAttention generation TE runs with --attention-backend
    flash (TransformerConfig.flash_attention_version, core_v0.19.0; absent at core_v0.14.0, where the
    installed flash-attn decides)."""
    flex_dispatcher_backend: bool = True
    """DeepEP under the flex dispatcher is --moe-flex-dispatcher-backend deepep (TransformerConfig,
    core_v0.19.0, whose __post_init__ warns "moe_enable_deepep is deprecated" for the old flag);
    core_v0.14.0 has only --moe-enable-deepep (False)."""
    moe_overlap_with_fsdp: bool = True
    """--overlap-moe-expert-parallel-comm with Megatron-FSDP (ZeRO-2/3): core_v0.19.0 runs the
    combined 1F1B's parameter gathers and gradient reduces through FSDP
    (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py); core_v0.14.0 accepts the pair at
    startup but the overlap bypasses the hooks FSDP gathers and reduces with (False)."""


VLLM_0_33_TIERS = (
    BatchTier(160, (), 16384, 1024),
    BatchTier(70, ("A100",), 8192, 1024),
    BatchTier(0, (), 2048, 256),
)
VLLM_0_22_TIERS = (
    BatchTier(70, ("A100",), 8192, 1024),
    BatchTier(0, (), 2048, 256),
)

V0_CHUNKED_PREFILL_BUDGET_TOKENS = 2048
"""SchedulerConfig.__post_init__ at 0.6.6.post1: the budget with chunked prefill on."""
VLLM_0_6_TIERS = (BatchTier(0, (), V0_CHUNKED_PREFILL_BUDGET_TOKENS, 256),)
"""V0: max_num_seqs 256 on every GPU (EngineArgs.__post_init__ at 0.6.6.post1: 256 unless
VLLM_USE_V1); the budget is v0_max_num_batched_tokens' (this tier's 2,048 with chunked prefill,
SchedulerConfig.__post_init__)."""
V0_LONG_CONTEXT_TOKENS = 32768
"""EngineArgs.create_engine_config at 0.6.6.post1: use_long_context = max_model_len > 32768."""
V0_MIN_BUDGET_TOKENS = 2048
"""SchedulerConfig.__post_init__ at 0.6.6.post1 without chunked prefill: max(max_model_len, 2048)."""


def v0_chunked_prefill_by_default(max_model_len: int, sliding_window: bool, speculative: bool) -> bool:
    """Whether V0 (0.6.6.post1) chunks prompts without --enable-chunked-prefill: only for a max
    model length above V0_LONG_CONTEXT_TOKENS on CUDA, and never for a sliding-window model or
    with speculative decoding (EngineArgs.create_engine_config, vllm/engine/arg_utils.py)."""
    return max_model_len > V0_LONG_CONTEXT_TOKENS and not sliding_window and not speculative


def v0_max_num_batched_tokens(max_model_len: int, chunked_prefill: bool) -> int:
    """V0's default token budget per step: 2,048 with chunked prefill, else the max model length
    (at least 2,048), so a whole prompt fits one step (SchedulerConfig.__post_init__, vllm/config.py
    at 0.6.6.post1)."""
    return V0_CHUNKED_PREFILL_BUDGET_TOKENS if chunked_prefill else max(max_model_len, V0_MIN_BUDGET_TOKENS)


VLLM_RELEASES = {
    "0.33.0": VllmRelease(
        "0.33.0", "vllm 0.33.0 wheel (PyPI; commit g4ba787ec9): vllm/engine/arg_utils.py, vllm/config/parallel.py",
        VLLM_0_33_TIERS, "fp8_per_tensor", nixl_pipelined_prefill=True, dp_balancer_read=True),
    "0.22.0": VllmRelease(
        "0.22.0", "vllm 0.22.0 wheel (PyPI; commit g0b3ba88f1): vllm/engine/arg_utils.py, vllm/config/parallel.py",
        VLLM_0_22_TIERS, "fp8", async_scheduling_off_for=("ngram",), prompt_tokenizer="microbatch"),
    "0.6.6.post1": VllmRelease(
        "0.6.6.post1", "vllm 0.6.6.post1 wheel (PyPI): vllm/engine/arg_utils.py, vllm/config.py, "
        "vllm/worker/worker.py, vllm/worker/model_runner.py (the V0 engine)",
        VLLM_0_6_TIERS, "fp8", v1_engine=False, async_scheduling=False, kv_cache_dtype_from_checkpoint=False,
        kernel_archs=((7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0))),
}
SGLANG_RELEASES = {
    "0.5.23": SglangRelease(
        "0.5.23", "sglang 0.5.23 wheel (PyPI): python/sglang/srt/server_args.py, sglang/srt/arg_groups/"
        "(fields/*.py, validation_hook.py check_server_args, memory_hook.py)",
        ("sglang", "serve"), reserved_min_gib_large_gpu=10, large_gpu_gib=60,
        router_launcher=("python", "-m", "sglang_router.launch_router"),
        router_source="sgl-project/sglang sgl-router/py_src/sglang_router/router_args.py at 083d6013",
        attn_dp_size_flag=True, moe_runner_marlin=True, pipelined_decode=True,
        hybrid_swa_architectures=frozenset({
            "Llama4ForConditionalGeneration", "GptOssForCausalLM", "GraniteSWAForCausalLM",
            "GraniteMoeSWAForCausalLM", "MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM", "Step3p5ForCausalLM",
            "Step3p7ForConditionalGeneration", "Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
            "Gemma4UnifiedForConditionalGeneration", "MellumForCausalLM", "IQuestQ1ForCausalLM",
            "MuseGlimmerForCausalLM", "MuseGlimmerForConditionalGeneration", "InklingForConditionalGeneration",
            "UnlimitedOCRForCausalLM", "BeamForCausalLM", "LagunaForCausalLM"})),
    "0.5.10.post1": SglangRelease(
        "0.5.10.post1", "sglang 0.5.10.post1 wheel (PyPI): python/sglang/srt/server_args.py",
        ("sglang", "serve"), reserved_min_gib_large_gpu=10, large_gpu_gib=60,
        router_launcher=("python", "-m", "sglang_router.launch_router"),
        router_source="sgl-project/sglang sgl-router/py_src/sglang_router/router_args.py at 083d6013",
        hybrid_swa_architectures=frozenset({
            "Llama4ForConditionalGeneration", "GptOssForCausalLM", "MiMoV2FlashForCausalLM", "Step3p5ForCausalLM"}),
        swa_eviction_interval=None, swa_lock_trims_to_window=False, swa_request_cap_pool=False),
}
MEGATRON_RELEASES = {
    "core_v0.19.0": MegatronRelease(
        "core_v0.19.0", "NVIDIA/Megatron-LM tag core_v0.19.0 (2026-08-19)", tp_may_exceed_query_groups=True),
    "core_v0.14.0": MegatronRelease(
        "core_v0.14.0", "NVIDIA/Megatron-LM tag core_v0.14.0 (2025-10-08)", tp_may_exceed_query_groups=False,
        moe_overlap_with_fsdp=False, sqrtsoftplus_router=False, flash_attention_version=False,
        flex_dispatcher_backend=False),
}
DEFAULT_MEGATRON = "core_v0.19.0"
RELEASES = {"vllm": VLLM_RELEASES, "sglang": SGLANG_RELEASES, "megatron": MEGATRON_RELEASES}


@dataclass(frozen=True)
class EngineVersions:
    """The release of each engine the plan and its commands are for."""

    vllm: str = "0.33.0"
    sglang: str = "0.5.23"
    megatron: str = DEFAULT_MEGATRON

    def __str__(self) -> str:
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))

    @property
    def vllm_release(self) -> VllmRelease:
        return VLLM_RELEASES[self.vllm]

    @property
    def sglang_release(self) -> SglangRelease:
        return SGLANG_RELEASES[self.sglang]

    @property
    def megatron_release(self) -> MegatronRelease:
        return MEGATRON_RELEASES[self.megatron]


def parse_engine_versions(text: str | None) -> EngineVersions:
    """`vllm=0.33.0,megatron=core_v0.14.0` -> EngineVersions (engines not named keep their
    default); a SpecError names the known engines and releases, or an engine named twice."""
    chosen: dict[str, str] = {}
    if text is not None and not text.strip():
        raise SpecError(f"--engine-version: empty; give ENGINE=VERSION with ENGINE one of {', '.join(RELEASES)}")
    parts = (text or "").split(",")
    for part in parts:
        if not part.strip():
            if text is not None and len(parts) > 1:  # "vllm=0.22.0," (--layout refuses its stray comma too)
                raise SpecError(f"--engine-version: {text.strip()!r}: an empty entry between commas")
            continue
        engine, sep, version = (s.strip() for s in part.partition("="))
        if not sep or engine not in RELEASES:
            raise SpecError(f"--engine-version: {part.strip()!r}: expected ENGINE=VERSION with ENGINE one of "
                            f"{', '.join(RELEASES)}")
        if not version:  # "vllm=" (found by a fuzz sweep: "vllm  is not known")
            raise SpecError(f"--engine-version: {engine}: no version after '=' (known: {', '.join(RELEASES[engine])})")
        if version not in RELEASES[engine]:
            raise SpecError(f"--engine-version: {engine} {version} is not known (known: "
                            f"{', '.join(RELEASES[engine])})")
        if engine in chosen:
            raise SpecError(f"--engine-version: {engine} given twice ({chosen[engine]} and {version})")
        chosen[engine] = version
    return EngineVersions(**chosen)


def vllm_batch_tier(release: VllmRelease, memory_gib: float, gpu_name: str) -> BatchTier:
    """The get_batch_defaults branch this GPU takes."""
    for tier in release.batch_tiers:
        if memory_gib >= tier.min_memory_gib and not any(n in gpu_name.upper() for n in tier.excluded_names):
            return tier
    return release.batch_tiers[-1]
