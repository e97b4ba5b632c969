"""What the user asks for, as typed values (the CLI fills these; the planners read them).

The single home of the request defaults (the CLI reads them from here) and of the checks
on request values: a bad value raises SpecError naming the command-line flag it came from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from planner import units
from planner.cost.ingress import PromptTokenizer
from planner.engines import EngineVersions
from planner.errors import SpecError

if TYPE_CHECKING:
    from planner.specs import GPU, ModelSpec

Objective = Literal["throughput", "latency"]
ServeMode = Literal["auto", "aggregated", "disaggregated"]
TrainEngine = Literal["megatron", "torchtitan"]
TRAIN_ENGINES: tuple[TrainEngine, ...] = ("megatron", "torchtitan")
DEFAULT_TOP_ROWS = 10
"""Table rows `plan` shows without --top (--json lists every layout unless --top is given)."""
MAX_TOKENS = 2**27
"""Plausibility bound of a length or token count (--input-len, --seq-len, ...): ~134M
tokens, as the model schema's max_position_embeddings."""
MAX_SEQUENCES = 2**24
"""Plausibility bound of --batch and --global-batch (16.8M sequences; published global
batches are ~10**3-10**4 sequences)."""
MAX_TOKENIZER_WORKERS = 1024
"""Bound on --renderer-num-workers (threads per API server; a host has a few hundred cores)."""
MAX_BURST_PROMPTS = 100_000
"""Plausibility bound of --num-prompts: the burst is simulated step by step."""
DEFAULT_NUM_PROMPTS = 1000
"""vllm bench serve's default --num-prompts (vllm/benchmarks/serve.py)."""
MIN_BURSTINESS = 0.01
"""The smallest --burstiness taken: a gamma draw of shape b is about U^(1/b) for small b, so at
b = 0.001 about half the draws underflow double precision to 0, and with them the intervals
and vllm bench serve's rescale of the arrivals to N / rate (a fuzz sweep: a ZeroDivisionError
at 1e-9, a hang at 5e-324). At 0.01 one draw in some 1,200 does."""
MAX_BURST_ARRIVAL_SECONDS = 30 * 24 * 3600
"""Plausibility bound of --num-prompts / --request-rate: a month of arrivals is a traffic
forecast, not a benchmark run (and clock times far beyond it lose the milliseconds the
simulation adds up)."""
MAX_SIMULATED_STEPS = 2_000_000
"""The burst simulation's budget of engine steps (about 20 s on one core); a burst that needs
more is refused with what to change, rather than run for hours."""
MAX_VIRTUAL_STAGES = 1024
"""Model chunks per device: at most one layer each, and layers are bounded (MAX_NUM_LAYERS)."""


@dataclass(frozen=True)
class LayoutFilter:
    """`--layout tp=8,pp=2`: keep only layouts matching the given degrees."""

    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    ep: int | None = None
    cp: int | None = None
    """Context parallelism (training only: the CLI refuses cp= for serving)."""

    def matches(self, tp: int, pp: int, dp: int, ep: int = 1, cp: int = 1) -> bool:
        return all(
            want is None or want == have
            for want, have in ((self.tp, tp), (self.pp, pp), (self.dp, dp), (self.ep, ep), (self.cp, cp))
        )


MOE_BACKENDS = {
    "auto": "the engine's default kernel",
    "marlin": "the weight-only Marlin kernel",
    "flashinfer_mxfp8": "FlashInfer's MXFP4 kernel on MXFP8-quantized activations",
}
"""ServeRequest.moe_backend's choices and what each runs."""
PROMPT_TOKENIZERS = ("auto", "serial", "microbatch", "none")
"""--prompt-tokenizer's choices (ServeRequest.prompt_tokenizer; auto = None, the engine's own)."""
ALL2ALL_BACKENDS = ("allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput")
"""ServeRequest.all2all_backend's choices (priced by planner/cost/moe.py and
serving_time.ep_exchange_ops)."""
DEFAULT_ALL2ALL_BACKEND = ALL2ALL_BACKENDS[0]
"""vLLM's default all2all_backend (ParallelConfig.all2all_backend, vllm/config/parallel.py at
0.33.0); the others are DeepEP's two modes."""


SPECULATIVE_METHODS = ("mtp", "eagle", "eagle3", "ngram")
"""Speculation.method's choices: vLLM's speculative_config methods the planner prices (vLLM's
SpeculativeMethod, vllm/config/speculative.py at 0.33.0): mtp = the model's own
multi-token-prediction layers; eagle / eagle3 = a separate draft head (--draft-model);
ngram = prompt lookup on the host (no draft model)."""
DRAFT_MODEL_METHODS = ("eagle", "eagle3")
"""The methods whose draft is a model of its own (--draft-model)."""
MAX_SPECULATIVE_TOKENS = 16
"""Plausibility bound of --num-speculative-tokens (published setups run 1-7)."""
DRAFT_MODEL_PLACEHOLDER = "DRAFT_MODEL"
"""Replace with the draft checkpoint's path or Hugging Face id (`--served-draft-model` sets it)."""


@dataclass(frozen=True)
class Speculation:
    """`--speculative-method`: speculative decoding, as vLLM's speculative_config runs it: each
    decode step verifies `num_tokens` drafted tokens per sequence alongside its own, and the
    drafter proposes the next ones (planner/cost/speculative.py)."""

    method: str
    num_tokens: int
    """k, vLLM's num_speculative_tokens: tokens drafted per sequence and step."""
    acceptance: tuple[float, ...]
    """`--draft-acceptance`: a_i, the probability the i-th drafted token is accepted given that
    the ones before it were (i = 1..k; one value given is every position's). Measured on the
    user's traffic (vLLM's spec-decode metrics report the per-position acceptance); the planner
    has no default, since it depends on the data as much as on the drafter."""
    draft: object | None = None
    """The draft model's ModelSpec (eagle, eagle3: --draft-model); None for mtp (the model's
    own MTP layers) and ngram (no model)."""
    served_draft: str = DRAFT_MODEL_PLACEHOLDER
    """What the launch commands name the draft checkpoint (--served-draft-model)."""

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise SpecError(f"--speculative-method: must be one of {', '.join(SPECULATIVE_METHODS)} "
                            f"(got {self.method})")
        check_positive("--num-speculative-tokens", self.num_tokens, MAX_SPECULATIVE_TOKENS)
        if not self.acceptance:
            raise SpecError("--draft-acceptance: needed with --speculative-method (the share of drafted tokens "
                            "the model accepts at each position, e.g. 0.8,0.6,0.4, as vLLM's spec-decode metrics "
                            "report it on your traffic)")
        if len(self.acceptance) not in (1, self.num_tokens):
            raise SpecError(f"--draft-acceptance: give one rate or one per drafted token "
                            f"({self.num_tokens}); got {len(self.acceptance)}")
        for rate in self.acceptance:
            if not 0 <= rate <= 1:  # also false for nan
                raise SpecError(f"--draft-acceptance: each rate must be in [0, 1] (got {rate})")
        if len(self.acceptance) == 1 and self.num_tokens > 1:
            object.__setattr__(self, "acceptance", self.acceptance * self.num_tokens)
        if self.method in DRAFT_MODEL_METHODS and self.draft is None:
            raise SpecError(f"--draft-model: --speculative-method {self.method} runs a draft model of its own; "
                            f"name its spec (YAML or config.json)")
        if self.method not in DRAFT_MODEL_METHODS and self.draft is not None:
            raise SpecError(f"--draft-model: only with --speculative-method {' or '.join(DRAFT_MODEL_METHODS)} "
                            f"(got {self.method})")


@dataclass(frozen=True)
class ServeRequest:
    input_len: int = 1024
    output_len: int = 256
    batch: int | None = None
    """Concurrent sequences per replica; None = vLLM's max-num-seqs default for the release and
    GPU (serve.wanted_batch), capped by the KV cache and the token budget, 1 for the latency
    objective without a finite rate."""
    max_model_len: int | None = None
    """None = the model's max_position_embeddings (vLLM's default)."""
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    kv_cache_from_checkpoint: bool = False
    """kv_cache_dtype was `auto`, resolved to the checkpoint's own format (for_checkpoint)."""
    moe_backend: Literal["auto", "marlin", "flashinfer_mxfp8"] = "auto"
    """`--moe-backend`: the routed experts' kernel (vLLM's --moe-backend): auto = the engine's
    pick for the format and GPU; marlin = the weight-only Marlin MoE kernel; flashinfer_mxfp8 =
    FlashInfer's TRT-LLM MoE with MXFP8 activations (MXFP4 experts on Blackwell); each priced at
    its measured rates (catalog serving_moe_kernels, <backend>_<format>)."""
    all2all_backend: Literal["allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput"] = \
        "allgather_reducescatter"
    """`--all2all-backend`: how an EP group spanning DP ranks exchanges tokens (vLLM's
    --all2all-backend; SGLang's --moe-a2a-backend deepep with --deepep-mode low_latency or
    normal): vLLM's default all-gather + reduce-scatter, or DeepEP's kernels sending each token
    only to its experts' ranks (planner/cost/moe.py, serving_time.ep_exchange_ops)."""
    enable_dbo: bool = False
    """`--enable-dbo`: dual-batch overlap (vLLM's --enable-dbo, SGLang's
    --enable-two-batch-overlap): a step of an EP group that exchanges tokens runs as two
    micro-batches, one's exchange hidden behind the other's work
    (serving_time.dbo_step_time)."""
    quantization_override: Literal["fp8", "int8", "int4"] | None = None
    """Set when `--quantization` changed the spec's weights: the engine must quantize a
    16-bit checkpoint itself (vLLM and SGLang can for fp8 only). A spec that is already
    quantized describes a pre-quantized checkpoint the engine detects on its own."""
    checkpoint_dtype: Literal["float32"] | None = None
    """Set when the spec's weights are float32: the engine loads them in 16 bits
    (served_dtype), as the plan prices them; the launch notes say so."""
    max_num_batched_tokens: int | None = None
    """None = vLLM's default for the chosen length (see serve.py)."""
    expert_imbalance: float | None = None
    """MoE under EP: routed tokens on the busiest GPU over the mean (>= 1); None =
    efficiency.EXPERT_LOAD_IMBALANCE."""
    num_gpus: int | None = None
    """`--gpus N`: plan for a subset of the cluster."""
    layout: LayoutFilter = LayoutFilter()
    objective: Objective = "throughput"
    max_tpot_seconds: float | None = None
    """`--max-tpot-ms`: SLA on the mean time per output token under load."""
    max_ttft_seconds: float | None = None
    """`--max-ttft-ms`: SLA on the mean time to first token under load."""
    max_e2e_seconds: float | None = None
    """`--max-e2e-ms`: SLA on the mean end-to-end request latency."""
    engine_versions: EngineVersions = EngineVersions()
    """`--engine-version`: the releases the plan (vLLM's batch defaults) and commands are for."""
    pool_engine: Literal["vllm", "sglang"] = "vllm"
    """The engine whose KV pool caps the sequences a replica runs: sglang (`--emit sglang`)
    keeps its default memory reserve out of --mem-fraction-static (emit/sglang.reserved_bytes),
    so its pool may hold fewer than vLLM's at --gpu-memory-utilization; the plan then prices
    (and ranks by) what SGLang runs (serve.replica_setup)."""
    request_rate_per_s: float | None = None
    """`--request-rate`: requests per second of a finite burst (inf = all at once), as `vllm
    bench serve` sends them; None = the steady state at the chosen concurrency only."""
    num_prompts: int | None = None
    """`--num-prompts`: requests in the burst (vllm bench serve's default 1000 when a rate or a
    dataset is given)."""
    max_concurrency: int | None = None
    """`--max-concurrency`: the burst's client keeps at most this many requests in flight
    (vllm bench serve's semaphore); None = no limit."""
    dataset: str | None = None
    """`--dataset`: the JSONL file the lengths came from (recorded in the output)."""
    dataset_lengths: tuple[tuple[int, int], ...] = ()
    """(input_len, output_len) per dataset line; input_len/output_len are then their means."""
    dataset_line_numbers: tuple[int, ...] = ()
    """Each of dataset_lengths' line in the --dataset file (empty without one)."""
    random_range_ratio: float | None = None
    """`--random-range-ratio`: the burst's lengths drawn as vllm bench serve's random dataset
    draws them, each uniform in [L (1 - r), L (1 + r)] around --input-len / --output-len;
    None = every request of the mean lengths."""
    burstiness: float | None = None
    """`--burstiness`: the burst's arrivals at a finite rate as vllm bench serve draws them,
    gamma intervals of shape b and mean 1/rate (workload.arrival_times_seconds); None = 1,
    Poisson. Only the simulated burst reads it: the open loop prices Poisson arrivals."""
    mode: ServeMode = "auto"
    """`--mode`: aggregated (every replica does prefill and decode), disaggregated (prefill and
    decode workers apart, the KV moved between them), auto (both, and which wins)."""
    speculation: Speculation | None = None
    """`--speculative-method` and its companions: speculative decoding; None = off."""
    async_scheduling: bool | None = None
    """`--async-scheduling / --no-async-scheduling`: vLLM schedules step k + 1 as step k starts
    (schedules_ahead); None = the release's default (VllmRelease.async_scheduling)."""
    prompt_tokenizer: Literal["serial", "microbatch", "none"] | None = None
    """How the API server tokenizes the text prompts (cost/ingress.py): None = the engine's own
    (SGLang, vLLM 0.33.0 and 0.6.6.post1: serial; vLLM 0.22.0: microbatch, the release's
    VllmRelease.prompt_tokenizer); none = the clients send token ids."""
    tokenizer_workers: int = 1
    """`--renderer-num-workers`: tokenizer threads per API server (vLLM's --renderer-num-workers,
    SGLang's --tokenizer-worker-num), each taking prompts one at a time; 1 = the engines'
    default. Priced for serial tokenizers (microbatches are tokenized side by side anyway)."""

    @property
    def tokenizer(self) -> PromptTokenizer | None:
        """The API server's prompt tokenizer the plan prices (prompt_tokenizer), None when
        the prompts come as token ids."""
        kind = self.prompt_tokenizer
        if kind is None:
            kind = "serial" if self.pool_engine == "sglang" else self.engine_versions.vllm_release.prompt_tokenizer
        return None if kind == "none" else PromptTokenizer(kind, threads=self.tokenizer_workers)

    @property
    def schedules_ahead(self) -> bool:
        """Whether the engine runs async scheduling: as asked, else the release's default (off
        with a speculative method the release excludes)."""
        if self.async_scheduling is not None:
            return self.async_scheduling
        release = self.engine_versions.vllm_release
        method = None if self.speculation is None else self.speculation.method
        return release.async_scheduling and method not in release.async_scheduling_off_for

    @cached_property
    def one_output_token(self) -> bool:
        """Every request of the workload emits one token (--output-len 1, or a --dataset whose
        rows all have output_len 1): no TPOT or ITL to report."""
        if self.dataset_lengths:
            return all(o == 1 for _, o in self.dataset_lengths)
        return self.output_len == 1

    @cached_property
    def decode_context_tokens(self) -> float:
        """A decoding sequence's mean KV context, weighted by how long each request decodes:
        sum O_j (I_j + O_j / 2) / sum O_j over the --dataset rows (a request of O output tokens
        is in O decode steps at its mean context I + O/2), I + O/2 without a dataset. Above the
        means' I + O/2 when long prompts come with long outputs; what the decode steps read and
        a running sequence holds (docs/cost-model.md, Serving: bursts and request rates, "A length mix in the steady state")."""
        if not self.dataset_lengths:
            if self.random_range_ratio is not None:  # independent uniform I and O: E[I] + E[O^2] / (2 E[O])
                (i_mean, _), (o_mean, o_square) = (uniform_length_moments(self.input_len, self.random_range_ratio),
                                                   uniform_length_moments(self.output_len, self.random_range_ratio))
                return i_mean + o_square / (2 * o_mean)
            return self.input_len + self.output_len / 2
        total = sum(o for _, o in self.dataset_lengths)
        return sum(o * (i + o / 2) for i, o in self.dataset_lengths) / total

    @cached_property
    def prompt_pairs(self) -> float:
        """A prompt's mean causal (query, key) pairs, I (I + 1) / 2 averaged over the --dataset
        rows (serving_time.causal_pairs of each): attention grows with E[I^2], so a few long
        prompts outweigh the mean prompt's square (E[I^2] / E[I]^2 = 7.5 for 10% of prompts at
        16-30K tokens among short ones)."""
        if not self.dataset_lengths and self.random_range_ratio is not None:
            mean, square = uniform_length_moments(self.input_len, self.random_range_ratio)
            return (square + mean) / 2
        rows = self.dataset_lengths or ((self.input_len, self.output_len),)
        return sum(i * (i + 1) / 2 for i, _ in rows) / len(rows)

    @cached_property
    def output_len_cv2(self) -> float:
        """The squared coefficient of variation of the requests' output lengths, Var(O) / E[O]^2:
        over the --dataset rows; for --random-range-ratio r, the uniform integers the burst draws
        (uniform_length_moments; about r^2 / 3: variance (2 r O)^2 / 12); 0 when every request
        has the mean lengths. How unequal the time each request holds an engine slot is (it
        decodes O - 1 steps): continuous_batching.slot_wait_seconds. Rows of 100 and 300 tokens: 100^2 / 200^2 = 0.25."""
        if self.dataset_lengths:
            outputs = [o for _, o in self.dataset_lengths]
            mean = sum(outputs) / len(outputs)
            return sum((o - mean) ** 2 for o in outputs) / len(outputs) / mean ** 2
        if self.random_range_ratio is None:
            return 0.0
        mean, square = uniform_length_moments(self.output_len, self.random_range_ratio)
        return (square - mean * mean) / (mean * mean)

    @property
    def has_sla(self) -> bool:
        """Whether any of --max-ttft-ms, --max-tpot-ms, --max-e2e-ms is set."""
        return any(limit is not None for limit in (self.max_ttft_seconds, self.max_tpot_seconds,
                                                     self.max_e2e_seconds))

    @property
    def queue_limit_flags(self) -> tuple[str, ...]:
        """The limits set that a queue behind a sent rate breaks: --max-ttft-ms and --max-e2e-ms
        (vllm bench serve counts both from the send; TPOT is the running sequences' alone)."""
        return tuple(flag for flag, limit in (("--max-ttft-ms", self.max_ttft_seconds),
                                              ("--max-e2e-ms", self.max_e2e_seconds)) if limit is not None)

    @property
    def offered_rate_per_s(self) -> float | None:
        """A finite --request-rate: the load every layout is priced at (arrivals at that rate,
        spread over its replicas); None without one or for inf (all at once: the layouts run at
        their capacity)."""
        rate = self.request_rate_per_s
        return rate if rate is not None and math.isfinite(rate) else None

    @property
    def burst_flags(self) -> list[str]:
        """The flags given that describe a burst for the step simulation to run."""
        return [flag for flag, value in (("--request-rate", self.request_rate_per_s),
                                         ("--num-prompts", self.num_prompts),
                                         ("--max-concurrency", self.max_concurrency),
                                         ("--dataset", self.dataset_lengths or None),
                                         ("--random-range-ratio", self.random_range_ratio),
                                         ("--burstiness", self.burstiness)) if value is not None]

    @property
    def simulates_burst(self) -> bool:
        return bool(self.burst_flags)

    def __post_init__(self) -> None:
        for flag, value in (("--input-len", self.input_len), ("--output-len", self.output_len),
                            ("--max-model-len", self.max_model_len),
                            ("--max-num-batched-tokens", self.max_num_batched_tokens)):
            check_positive(flag, value, MAX_TOKENS)
        check_positive("--batch", self.batch, MAX_SEQUENCES)
        check_positive("--num-prompts", self.num_prompts, MAX_BURST_PROMPTS)
        check_positive("--max-concurrency", self.max_concurrency, MAX_SEQUENCES)
        check_positive("--renderer-num-workers", self.tokenizer_workers, MAX_TOKENIZER_WORKERS)
        if self.request_rate_per_s is not None and not (self.request_rate_per_s > 0):  # also nan
            raise SpecError(f"--request-rate: must be positive or inf (got {self.request_rate_per_s})")
        if self.request_rate_per_s is not None:
            span = (self.num_prompts or DEFAULT_NUM_PROMPTS) / self.request_rate_per_s
            if span > MAX_BURST_ARRIVAL_SECONDS:
                raise SpecError(f"--request-rate {self.request_rate_per_s:g}: {self.num_prompts or DEFAULT_NUM_PROMPTS:,} "
                                f"prompts would arrive over {span:,.3g} s, more than a month (the burst is a benchmark "
                                f"run; give a higher rate)")
        if self.mode == "disaggregated" and self.objective == "latency":
            raise SpecError("--objective latency: disaggregated workers are sized for goodput at their rate-matched "
                            "load, and splitting the phases cannot speed a lone request (its KV transfer adds to "
                            "TTFT); use --mode auto or aggregated for latency")
        if self.burstiness is not None:
            if not (MIN_BURSTINESS <= self.burstiness < math.inf):  # also nan
                raise SpecError(f"--burstiness: must be finite and at least {MIN_BURSTINESS:g}, the gamma intervals' "
                                f"shape (smaller shapes' draws underflow to 0 in double precision; got {self.burstiness})")
            if self.request_rate_per_s is None or math.isinf(self.request_rate_per_s):
                raise SpecError("--burstiness: shapes the intervals between arrivals at a finite --request-rate "
                                "(vllm bench serve ignores it at inf); give a rate")
        ratio = self.random_range_ratio
        if ratio is not None and not (0 <= ratio < 1):  # also nan
            raise SpecError(f"--random-range-ratio: must be in [0, 1), as vllm bench serve requires (got {ratio})")
        if ratio is not None and self.dataset_lengths:
            raise SpecError("--random-range-ratio: the lengths come from --dataset; give one or the other")
        check_fraction("--gpu-memory-utilization", self.gpu_memory_utilization)
        for flag, limit in (("--max-tpot-ms", self.max_tpot_seconds), ("--max-ttft-ms", self.max_ttft_seconds),
                            ("--max-e2e-ms", self.max_e2e_seconds)):
            if limit is not None:
                check_positive(flag, units.seconds_to_ms(limit))


Fp8Recipe = Literal["delayed", "tensorwise", "mxfp8", "blockwise"]
FP8_RECIPES: tuple[Fp8Recipe, ...] = ("delayed", "tensorwise", "mxfp8", "blockwise")
FP8_RECIPE_DEFAULTS: dict[str, Fp8Recipe] = {"megatron": "delayed", "torchtitan": "tensorwise"}
"""Each engine's own default scaling: Megatron-LM's --fp8-recipe defaults to delayed
(arguments.py at core_v0.14.0; TransformerConfig.fp8_recipe at core_v0.19.0); torchtitan's
[quantize.linear.float8] recipe_name None is torchao's tensorwise dynamic scaling
(config/job_config.py at v0.2.2), and it has no delayed scaling."""
MoeDispatcher = Literal["auto", "alltoall", "deepep"]
MOE_DISPATCHERS: tuple[MoeDispatcher, ...] = ("auto", "alltoall", "deepep")


def for_checkpoint(model: ModelSpec, request: ServeRequest) -> ServeRequest:
    """The request with `--kv-cache-dtype auto` resolved as the engine resolves it for this
    checkpoint (ModelSpec.checkpoint_kv_cache_dtype), so the plan prices that cache and the
    command says so. vLLM (VllmRelease.kv_cache_dtype_from_checkpoint: 0.17.0 and later) takes
    the fp8 or NVFP4 cache a ModelOpt checkpoint names; SGLang 0.5.10.post1 and 0.5.23 take an
    fp8 one (its ModelOpt config's kv_cache_quant_algo "FP8": ModelRunner.configure_kv_cache_dtype,
    srt/model_executor/model_runner.py at 0.5.10.post1; srt/mem_cache/kv_cache_dtype.py at
    0.5.23) and keep 16 bits otherwise. An NVFP4 KV cache under vLLM is not modelled: a usage
    error naming the flag that plans an fp8 one instead."""
    kv = model.checkpoint_kv_cache_dtype
    if request.kv_cache_dtype != "auto" or kv is None or request.quantization_override is not None:
        return request  # --quantization: another checkpoint (16-bit, quantized on load, or AWQ/GPTQ)
    if request.pool_engine == "sglang":
        return replace(request, kv_cache_dtype="fp8", kv_cache_from_checkpoint=True) if kv == "fp8" else request
    if not request.engine_versions.vllm_release.kv_cache_dtype_from_checkpoint:
        return request
    if kv == "nvfp4":
        raise SpecError(f"{model.name}: its quantization config asks vLLM for an NVFP4 KV cache "
                        "(kv_cache_scheme), which the planner does not model; pass --kv-cache-dtype fp8 to plan an "
                        "fp8 one")
    return replace(request, kv_cache_dtype=model.checkpoint_kv_cache_dtype, kv_cache_from_checkpoint=True)


def for_vllm_release(request: ServeRequest) -> ServeRequest:
    """The request as the chosen vLLM release can serve it. The V0 engine (VllmRelease.v1_engine
    False: 0.6.6.post1) has no expert parallelism, no disaggregated serving, no --speculative-config,
    --moe-backend, --all2all-backend or dual-batch overlap: asking for one is a usage error; the
    search keeps ep = 1 and aggregated replicas (`--mode auto` plans those alone)."""
    release = request.engine_versions.vllm_release
    method = None if request.speculation is None else request.speculation.method
    if request.async_scheduling and method in release.async_scheduling_off_for:
        raise SpecError(f"--async-scheduling: vllm {release.version} does not run it with --speculative-method "
                        f"{method} (it refuses to start); drop it or plan for a later vllm")
    if release.v1_engine:
        return request
    v0 = f"--engine-version vllm={release.version} (the V0 engine)"
    asked = [(request.layout.ep not in (None, 1), f"--layout ep={request.layout.ep}", "expert parallelism"),
             (request.mode == "disaggregated", "--mode disaggregated", "disaggregated prefill and decode"),
             (request.speculation is not None, "--speculative-method", "--speculative-config"),
             (request.moe_backend != "auto", f"--moe-backend {request.moe_backend}", "--moe-backend"),
             (request.all2all_backend != DEFAULT_ALL2ALL_BACKEND, f"--all2all-backend {request.all2all_backend}",
              "expert parallelism"),
             (request.enable_dbo, "--enable-dbo", "dual-batch overlap"),
             (bool(request.async_scheduling), "--async-scheduling", "async scheduling")]
    for wanted, flag, feature in asked:
        if wanted:
            raise SpecError(f"{flag}: {v0} has no {feature}; plan it for vllm=0.22.0 or later")
    layout = LayoutFilter(request.layout.tp, request.layout.pp, request.layout.dp, 1, request.layout.cp)
    return replace(request, layout=layout, mode="aggregated")


def check_tokenizer_workers(request: ServeRequest, engine: str) -> None:
    """--renderer-num-workers above 1 launched on vLLM needs its renderer's thread pool (0.22.0
    and later, --renderer-num-workers); the V0 engine (0.6.6.post1) tokenizes on one thread and
    has no such flag: a usage error. SGLang takes it as --tokenizer-worker-num."""
    release = request.engine_versions.vllm_release
    if request.tokenizer_workers > 1 and engine in ("vllm", "vllm-ray") and not release.v1_engine:
        raise SpecError(f"--renderer-num-workers: --engine-version vllm={release.version} (the V0 engine) has no "
                        f"renderer thread pool (its API server tokenizes on one thread); plan it for vllm=0.22.0 "
                        f"or later (SGLang takes it as --tokenizer-worker-num)")


ATTENTION_KERNELS = ("auto", "fa2")
"""--attention-kernel values (TrainRequest.attention_kernel)."""
"""--moe-dispatcher's choices (TrainRequest.moe_dispatcher)."""
MAX_MOE_HOST_SECONDS = 1.0
"""--moe-host-ms above a second per MoE block forward is a unit mistake, not a host."""
MAX_RECOMPUTE_NUM_LAYERS = 1024
"""--recompute-num-layers above a thousand layers a chunk is a typo (no model has that many)."""
MAX_MTP_LAYERS = 16
"""--mtp-layers: DeepSeek-V3 trained 1 (sec. 2.2); more than 16 is a typo, not a recipe."""


@dataclass(frozen=True)
class TrainRequest:
    global_batch: int
    """Sequences per optimizer step (B)."""
    seq_len: int
    num_gpus: int | None = None
    layout: LayoutFilter = LayoutFilter()
    micro_batch: int | None = None
    schedule: Literal["gpipe", "1f1b", "interleaved"] | None = None
    virtual_stages: int | None = None
    recompute: Literal["none", "outputs", "op", "selective", "full"] | None = None
    sequence_parallel: bool | None = None
    zero_stage: int | None = None
    """`--zero`: 0-3, 1 = Megatron's distributed optimizer; None = searched."""
    attention: Literal["flash", "materialized"] = "flash"
    """`--attention`: flash (every current stack: no s x s scores kept, attention recomputed
    in the backward) or materialized (2021-22 Megatron-LM and DeepSpeed kernels)."""
    attention_kernel: Literal["auto", "fa2"] = "auto"
    """`--attention-kernel`, with flash: auto (the kernel the engine picks by itself, at the
    GPU's measured rate) or fa2 (FlashAttention-2 forced: its published Hopper utilization);
    docs/cost-model.md#training-attention."""
    expert_imbalance: float | None = None
    """`--expert-imbalance`, MoE under EP: routed tokens on the busiest GPU over the mean
    (>= 1); None = efficiency.EXPERT_LOAD_IMBALANCE."""
    precision: Literal["bf16", "fp8"] = "bf16"
    """`--precision`: bf16, or fp8 (the blocks' linear GEMMs in fp8, scaled by `fp8_recipe`;
    needs a GPU with fp8 tensor cores). bf16 means the 16-bit mixed precision: the checkpoint's
    16 bits with Megatron unless `bf16_asked` (train.trained_model)."""
    bf16_asked: bool = False
    """`--precision bf16` given: bfloat16 even where the checkpoint is float16 (a run from
    scratch has no checkpoint to follow; without it Megatron trains a float16 one with --fp16)."""
    fp8_recipe: Fp8Recipe | None = None
    """`--fp8-recipe`, only with --precision fp8: delayed (Transformer Engine DelayedScaling),
    tensorwise (Float8CurrentScaling), mxfp8 (MXFP8BlockScaling, Blackwell) or blockwise
    (Float8BlockScaling, Hopper and later; Megatron only); None = the
    engine's default, FP8_RECIPE_DEFAULTS (resolved by `resolved_fp8_recipe`)."""
    grad_reduce: Literal["fp32", "bf16"] = "fp32"
    """`--grad-reduce`: the main gradients' dtype, fp32 (Megatron's default) or bf16
    (--grad-reduce-in-bf16: half the gradient memory and DP traffic, less precise sums)."""
    optimizer_states: Literal["fp32", "bf16"] = "fp32"
    """`--optimizer-states`: Adam's moments' dtype, fp32 (Megatron's default) or bf16 (Megatron's
    precision-aware optimizer: 12 -> 6 or 8 bytes of optimizer state per parameter, before
    sharding; needs the distributed optimizer)."""
    tp_comm_overlap: bool = True
    """`--no-tp-comm-overlap` turns it off: Transformer Engine's TP communication/GEMM
    overlap where Megatron can run it (train.tp_comm_overlap_possible)."""
    moe_comm_overlap: bool = True
    """`--no-moe-comm-overlap` turns it off: Megatron's expert-parallel all-to-all overlap
    (--overlap-moe-expert-parallel-comm) where it can run (train.moe_comm_overlap_possible)."""
    moe_dispatcher: MoeDispatcher = "auto"
    """`--moe-dispatcher`, MoE with EP: auto (DeepEP where it can run and prices faster, else
    alltoall), alltoall (Megatron's NCCL all-to-all dispatcher) or deepep (Megatron's flex
    dispatcher on DeepEP; train.moe_dispatcher_for)."""
    moe_host_seconds: float | None = None
    """`--moe-host-ms` (in seconds here), MoE: the host's time to issue one MoE block's forward,
    which the GPU waits out after each MoE layer's token-count sync where its own forward is
    shorter (training_time.moe_host_exposed_seconds); None = the engine's fitted value
    (train_engines.MOE_FORWARD_HOST_SECONDS). Lower it for a run that captures the block in
    CUDA graphs or a host measured faster."""
    mtp_layers: int | None = None
    """`--mtp-layers`: multi-token-prediction modules trained on the last stage (Megatron's
    --mtp-num-layers); None = the engine's default for the model (train.trained_model: the
    spec's with Megatron, none with torchtitan)."""
    engine_versions: EngineVersions = EngineVersions()
    """`--engine-version`: the releases the commands are for."""
    engine: TrainEngine = "megatron"
    """`--engine`: the training framework whose parallelism rules bound the search and whose
    launch is printed (planner/train_engines.py): megatron (Megatron-LM) or torchtitan."""
    recompute_num_layers: int | None = None
    """`--recompute-num-layers`, Megatron: full recompute of only the first N layers of each model
    chunk (--recompute-method block); implies recompute full. None: with full recompute the search
    takes the least N that fits (train_search.least_block_recompute)."""

    def __post_init__(self) -> None:
        if self.engine not in TRAIN_ENGINES:
            raise SpecError(f"--engine: must be one of {', '.join(TRAIN_ENGINES)} (got {self.engine})")
        for flag, value, upper in (("--global-batch", self.global_batch, MAX_SEQUENCES),
                                   ("--seq-len", self.seq_len, MAX_TOKENS),
                                   ("--micro-batch", self.micro_batch, MAX_SEQUENCES),
                                   ("--virtual-stages", self.virtual_stages, MAX_VIRTUAL_STAGES)):
            check_positive(flag, value, upper)
        check_positive("--recompute-num-layers", self.recompute_num_layers, MAX_RECOMPUTE_NUM_LAYERS)
        if self.recompute_num_layers is not None and self.engine != "megatron":
            raise SpecError(f"--recompute-num-layers: only with --engine megatron (its --recompute-method block); "
                            f"{self.engine} recomputes every block or none")
        if self.recompute_num_layers is not None and self.recompute not in (None, "full"):
            raise SpecError(f"--recompute-num-layers: only with --recompute full (got --recompute {self.recompute}); "
                            f"Megatron's selective levels take no layer count")
        if self.moe_dispatcher not in MOE_DISPATCHERS:
            raise SpecError(f"--moe-dispatcher: must be one of {', '.join(MOE_DISPATCHERS)} (got {self.moe_dispatcher})")
        if self.moe_host_seconds is not None and not 0 <= self.moe_host_seconds <= MAX_MOE_HOST_SECONDS:
            raise SpecError(f"--moe-host-ms: must be between 0 and {units.seconds_to_ms(MAX_MOE_HOST_SECONDS):g} "
                            f"(got {units.seconds_to_ms(self.moe_host_seconds):g})")
        if self.mtp_layers is not None and not 0 <= self.mtp_layers <= MAX_MTP_LAYERS:
            raise SpecError(f"--mtp-layers: must be between 0 and {MAX_MTP_LAYERS} (got {self.mtp_layers})")
        if self.mtp_layers and self.engine != "megatron":
            raise SpecError(f"--mtp-layers {self.mtp_layers}: only with --engine megatron; {self.engine} builds no "
                            f"multi-token-prediction module")
        if self.moe_dispatcher == "deepep" and self.engine != "megatron":
            raise SpecError(f"--moe-dispatcher deepep: only with --engine megatron (its flex token dispatcher); "
                            f"the {self.engine} plan prices NCCL all-to-alls")
        if self.fp8_recipe is not None and self.fp8_recipe not in FP8_RECIPES:
            raise SpecError(f"--fp8-recipe: must be one of {', '.join(FP8_RECIPES)} (got {self.fp8_recipe})")
        if self.fp8_recipe is not None and self.precision != "fp8":
            raise SpecError(f"--fp8-recipe: only with --precision fp8 (got --precision {self.precision})")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise SpecError(f"--attention-kernel: must be one of {', '.join(ATTENTION_KERNELS)} "
                            f"(got {self.attention_kernel})")
        if self.attention_kernel != "auto" and self.attention != "flash":
            raise SpecError(f"--attention-kernel {self.attention_kernel}: only with --attention flash "
                            f"(got --attention {self.attention}, which runs no flash kernel)")
        if self.zero_stage is not None and self.zero_stage not in (0, 1, 2, 3):
            raise SpecError(f"--zero: must be 0, 1, 2 or 3 (got {self.zero_stage})")
        if self.virtual_stages is not None:
            if self.schedule not in (None, "interleaved"):
                raise SpecError(f"--virtual-stages: only with --schedule interleaved "
                                f"(got --schedule {self.schedule})")
            if self.virtual_stages < 2:
                raise SpecError(f"--virtual-stages: interleaving needs at least 2 chunks per "
                                f"device (got {self.virtual_stages}; 1 is --schedule 1f1b)")

    @property
    def resolved_fp8_recipe(self) -> Fp8Recipe | None:
        """The fp8 recipe the plan prices and launches: None for bf16, else --fp8-recipe or
        the engine's default."""
        if self.precision != "fp8":
            return None
        return self.fp8_recipe or FP8_RECIPE_DEFAULTS[self.engine]


def random_range_bounds(length: int, range_ratio: float) -> tuple[int, int]:
    """The integers `vllm bench serve --dataset-name random --random-range-ratio r` draws a
    length from: [floor(L (1 - r)), ceil(L (1 + r))], at least 1 (RandomDataset at 0.33.0)."""
    low = max(1, math.floor(length * (1 - range_ratio)))
    return low, max(low, math.ceil(length * (1 + range_ratio)))


def uniform_length_moments(length: int, range_ratio: float) -> tuple[float, float]:
    """(E[L], E[L^2]) of a length uniform over random_range_bounds' n integers a..b: the mean
    (a + b) / 2, the variance (n^2 - 1) / 12. L = 100, r = 0.5: 50..150, mean 100, variance
    (101^2 - 1) / 12 = 850, E[L^2] = 10,850."""
    low, high = random_range_bounds(length, range_ratio)
    mean, count = (low + high) / 2, high - low + 1
    return mean, mean * mean + (count * count - 1) / 12


def check_positive(flag: str, value: float | None, upper: float | None = None) -> None:
    """None means "not given" and passes; nan and inf do not (nan > 0 is false, so a nan
    limit would silently be no limit)."""
    if value is None:
        return
    if not math.isfinite(value):
        raise SpecError(f"{flag}: must be a finite number (got {value})")
    if value <= 0:
        raise SpecError(f"{flag}: must be positive (got {value})")
    if upper is not None and value > upper:
        raise SpecError(f"{flag}: {value:,} is above {upper:,} (a plausibility bound)")


def check_fraction(flag: str, value: float) -> None:
    if not 0 < value <= 1:  # also false for nan
        raise SpecError(f"{flag}: must be in (0, 1] (got {value})")


def served_dtype(gpu: GPU) -> Literal["bfloat16", "float16"]:
    """The 16 bits a float32 checkpoint is served in: bfloat16 where the GPU has it, else
    float16. vLLM's --dtype auto downcasts float32 to the platform's first supported dtype,
    bfloat16 on CUDA from compute capability 8.0 (vllm/config/model.py _resolve_auto_dtype at
    0.33.0); the plan emits the choice as --dtype, which SGLang takes too."""
    if gpu.compute_capability is not None:
        return "bfloat16" if gpu.compute_capability >= BF16_MIN_COMPUTE_CAPABILITY else "float16"
    return "bfloat16" if gpu.peak_flops_per_s("bf16") is not None else "float16"  # not CUDA: its peaks say


BF16_MIN_COMPUTE_CAPABILITY = 8.0
"""CUDA's bfloat16 from Ampere on (vLLM's CudaPlatform supported_dtypes, 0.33.0)."""
