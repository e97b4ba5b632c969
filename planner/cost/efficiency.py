"""Every efficiency and overhead constant of the cost model, named, with its source.

Nothing else in the planner holds a tuned number. Where a GPU's catalog entry or a
probe measurement gives a figure, that figure wins over these defaults.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from planner import units

if TYPE_CHECKING:
    from planner.specs import GPU, ModelSpec

# ---------------------------------------------------------------- shared (serve and train)

DEFAULT_MATMUL_FRACTION_OF_PEAK = 0.75
"""Used when the catalog has no measured "maximum achievable matmul" for a GPU:
between MI300X's 51-60% (depending on the ROCm version) and A100's 87% of the dense peak
(stas00/ml-engineering, compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS
comparison table"); H100 SXM measures 80%, B200 78%, GB200 73%."""


def achievable_matmul_flops_per_s(peak_flops_per_s: float, measured_flops_per_s: float | None,
                                  unmeasured_fraction: float = DEFAULT_MATMUL_FRACTION_OF_PEAK) -> float:
    """The measured maximum achievable matmul when known, else `unmeasured_fraction` of the peak
    (unmeasured_fraction_of_peak: the GPU's own 16-bit share where it is lower than the default)."""
    if measured_flops_per_s is not None:
        return measured_flops_per_s
    return unmeasured_fraction * peak_flops_per_s


def unmeasured_fraction_of_peak(gpu: GPU) -> float:
    """The share of a precision's dense peak its GEMMs are priced at where the catalog measured no
    rate for that precision: the GPU's measured bf16 share (achievable / peak) where it is below
    DEFAULT_MATMUL_FRACTION_OF_PEAK, else that default. A GPU whose bf16 GEMMs reach half their
    peak is not priced at 0.75 of its fp8 peak: MI300X measures 668 of 1,307 bf16 TFLOP/s (0.51),
    so its unmeasured fp8 runs at 0.51 x 2,615 = 1,336 TFLOP/s, 2.0x its bf16 rate as the peaks
    are, where the default gave 1,961 (2.9x, a layer more than twice as fast in fp8). Where both
    are measured the two shares are close (this catalog: H100 SXM bf16 0.80, fp8 0.71; B200 0.78,
    0.76), and the cap keeps a GPU whose bf16 share is high (A100 0.87) at the default elsewhere."""
    peak, measured = gpu.peak_flops_per_s("bf16"), gpu.achievable_flops_per_s("bf16")
    if peak is None or measured is None:
        return DEFAULT_MATMUL_FRACTION_OF_PEAK
    return min(DEFAULT_MATMUL_FRACTION_OF_PEAK, measured / peak)


def dense_peak_flops_per_s(gpu: GPU, precision: str) -> float | None:
    """The datasheet dense peak; where the catalog has none but a measured matmul rate exists
    (a `plan probe` profile of a GPU whose tensor peaks are not confirmed), that rate over
    DEFAULT_MATMUL_FRACTION_OF_PEAK: the default relation read backwards, so a measured rate
    is never thrown away for want of a datasheet. None: neither is known."""
    peak = gpu.peak_flops_per_s(precision)
    if peak is not None:
        return peak
    measured = gpu.achievable_flops_per_s(precision)
    return None if measured is None else measured / DEFAULT_MATMUL_FRACTION_OF_PEAK


NCCL_BUSBW_FRACTION_OF_LINK = 0.77
"""Measured large-message all-reduce busbw over link bandwidth: 8x A100 NVSwitch
230-235 GB/s of 300 (nccl-tests all_reduce_perf on DGX A100; NCCL's protocol overhead is
about 20%, NVIDIA/nccl-tests issue #212; docs/cost-model.md#efficiency-constants); applied to the alpha-beta model when
the probe has not measured the link (serving and training alike)."""

HOST_STAGED_BANDWIDTH_FRACTION = 0.42
"""A PCIe link's bandwidth without GPU peer-to-peer access (GeForce cards on NVIDIA's stock
driver: NCCL copies each transfer into host memory and out again) over its bandwidth with it:
one 2x RTX 3090 PCIe Gen4 x16 machine measured 11.28 GB/s unidirectional with P2P off and
27.12 GB/s on (CUDA's p2pBandwidthLatencyTest; noonghunna/club-3090, docs/PCIE_P2P.md).
Cross-check: a 4x RTX 4090 all-reduce plateaus at 12.7 GB/s busbw (tinygrad/open-gpu-kernel-
modules pull request #22) where the P2P-patched driver gives 25.9 (issue #36); priced: 10.0.
docs/cost-model.md#collectives-alpha-beta-ring-busbw."""
HOST_STAGED_STEP_LATENCY_SECONDS = units.us_to_seconds(5)
"""Per ring step latency of NCCL's host-staged path (the LL protocol polling host memory).
Published small-message times on GeForce cards without P2P: 2 GPUs 11.3-11.9 us (an 8-byte
all-to-all, one exchange; tinygrad/open-gpu-kernel-modules issue #17), 8 GPUs 42 us (RTX 4090,
8-byte all-reduce, NVIDIA/nccl issue #1530) and 54 us (RTX 3090, NVIDIA/nccl issue #1439):
5.8 and 3.0-3.9 us per step of the 2 (n - 1) step ring; 5 us lies between (2 GPUs 10 us,
8 GPUs 70 us)."""

# ---------------------------------------------------------------- serving (vLLM)

DECODE_HBM_UTILIZATION = 0.76
"""Share of datasheet HBM bandwidth a decode step's weight and KV reads achieve (the linear
layers' weights at the GPU's measured serving_decode_hbm_utilization where the catalog has it).
Fitted with GPT_FAST_SECONDS_PER_LAYER to gpt-fast's TP series (its README, "Tensor
Parallelism"; docs/cost-model.md#efficiency-constants)."""
GPT_FAST_SECONDS_PER_LAYER = units.us_to_seconds(38)
"""gpt-fast's fixed cost per layer per decode step (kernel launches, synchronisation, small
kernels), independent of the bytes read: it is why per-GPU bandwidth utilisation falls as TP
grows (gpt-fast README, "Tensor Parallelism": per-GPU bandwidth falls from 1397 to 704 GB/s
from TP 1 to 8). The serving step prices vLLM's (ENGINE_STEP_SECONDS_PER_LAYER); this one
prices gpt-fast's own stack in its anchor (tests/serve/test_serve_anchor_gpt_fast.py).

Both constants come from one published series, not one row: gpt-fast's batch-1 decode on
8x A100-80GB (README, Benchmarks / Tensor Parallelism: Llama-2-7B at TP 1/2/4/8 = 104.9,
168.84, 254.02, 328.43 tok/s; Llama-2-70B at TP 2/4/8 = 21.32, 38.01, 62.50 tok/s).
time = bytes/(2039 GB/s * 0.76) + L * 38 us + the TP all-reduces reproduces all seven
within 10% (tests/serve/test_serve_anchor_gpt_fast.py). Those GPUs were power-limited to
330 W; Databricks' 55-60% MBU for 70B on 2-4 GPUs is what this gives once the fixed
costs are counted (about 64% on 4 A100)."""

DECODE_LAYER_KERNELS = 10
"""Kernels in one decode step of a dense layer of gpt-fast's model.py (pytorch-labs/gpt-fast,
TransformerBlock under torch.compile, whose batch-1 decode GPT_FAST_SECONDS_PER_LAYER
was fitted to; an MoE layer's share of vLLM's ENGINE_STEP_SECONDS_PER_LAYER is counted in the
same kernels): the attention norm, wqkv, rotary + KV-cache update, attention, wo, the
residual add + FFN norm, w1, w3, silu * mul, w2 (the residual add fuses into the next norm)."""
DENSE_MLP_KERNELS = 4
"""Of those, the dense MLP's: w1, w3, silu * mul and w2 (FeedForward.forward)."""
ROUTER_KERNELS = 1
"""An MoE layer's router GEMM (hidden -> experts logits), a kernel of its own beside the
fused-MoE op: vLLM 0.33.0's MoE blocks hand their gate (GateLinear) to the FusedMoE layer,
which runs it before the fused experts (vllm/model_executor/models/qwen3_moe.py, gate=self.gate)."""


def moe_layer_overhead_factor(replaces_dense_mlp: bool) -> float:
    """An MoE layer's fixed per-layer cost over a dense layer's. Where the fused-MoE op carries
    its own measured floor (priced with the op) and no shared expert runs beside it, the op
    replaces the dense MLP's kernels and the router GEMM is added: (10 - 4 + 1) / 10 = 0.7.
    Where shared experts run as a dense MLP beside the op (DeepSeek, Qwen2-MoE), or the op
    has no measured floor (the GPU's kernel is not in the catalog: the MLP's share stands for
    the op's), those kernels stay: (10 + 1) / 10 = 1.1."""
    replaced = DENSE_MLP_KERNELS if replaces_dense_mlp else 0
    return (DECODE_LAYER_KERNELS - replaced + ROUTER_KERNELS) / DECODE_LAYER_KERNELS


ENGINE_STEP_SECONDS_PER_LAYER = units.us_to_seconds(56)
"""vLLM's fixed cost per layer per step (kernel floors and launch gaps of a full-CUDA-graph
decode: the decode attention kernel's floor, rotary and the KV-cache write, the activation
quantization, the GEMMs' own floors), independent of the bytes read. It is 18 us above
gpt-fast's (GPT_FAST_SECONDS_PER_LAYER): AIConfigurator's vLLM 0.24.0 decode attention alone
takes 9-12 us per call at any small batch (FA3 on H100/H200, FlashInfer's TRT-LLM kernel on
B200), and every vLLM linear layer 4-6 us over its weight read.
Fitted with ENGINE_STEP_SECONDS and ENGINE_STEP_SECONDS_PER_SEQUENCE, by a grid of 30 points
over 38-59 us per layer x 0-1 ms per step x 5-20 us per sequence, on the TPOT of
AIConfigurator's measured vLLM runs (aiconfigurator-core 0.12.0, systems/silicon_sample.csv;
tests/fixtures/aiconfigurator_silicon/vllm_agg.csv) as benchmarked (bench/serving_calibration.py
--as-benchmarked), after the linear layers' weight stream was measured per GPU
(serving_decode_hbm_utilization): the 438 runs whose engine captured decode in full CUDA graphs
(vLLM >= 0.11's default, and the B200 Llama scripts' FULL_DECODE_ONLY: gpt-oss-120b on H100,
H200, B200; Llama-3.1-70B fp8 and NVFP4 on B200; Qwen3-32B on H100), median |TPOT error|
5.2% (59 us: 5.4%, 53 us: 5.3%, 50 us: 6.2%, 44 us: 8.0%). The Llama-3.1-70B runs on H100 and H200 ran
vLLM 0.10.2's piecewise graphs (attention outside the graph) and are not in the fit; they land
at -6% and +0% (docs/cost-model.md, Serving: calibration). bench/engine_step_fit.py reproduces
any point of the grid."""
ENGINE_STEP_SECONDS = 0.0
"""vLLM's fixed cost per scheduled step on the GPU's timeline outside the model's kernels:
fitted to zero (the same fit; 0.25 ms scores 6.4% at 56 us). Every run of the set used async
scheduling (on by default in current vLLM), which overlaps the scheduler's and output
processing's CPU work with the GPU's step."""
ENGINE_STEP_SECONDS_PER_SEQUENCE = units.us_to_seconds(10)
"""vLLM's cost per sequence in a step that async scheduling does not hide: per-request input
preparation, the sampler and logits processing (the same fit; 5 us scores 5.2% too, 20 us 5.6%)."""
FIRST_TOKEN_SECONDS = units.ms_to_seconds(10)
"""Fixed client-visible cost of a request's first token outside the engine's steps:
HTTP, the API server to engine hand-off, detokenizing and streaming it (the prompt's
tokenization is priced apart: TOKENIZE_SECONDS_PER_PROMPT_TOKEN, cost/ingress.py). An estimate
(docs/cost-model.md#efficiency-constants)."""
TOKENIZE_SECONDS_PER_PROMPT_TOKEN = units.us_to_seconds(1.7)
"""The API server's tokenization of a text prompt, per prompt token, on its one tokenizer
thread: Hugging Face tokenizers 0.22.2 (PreTrainedTokenizerFast, as vLLM and SGLang call it),
measured on this project's development machine (bench/tokenize_cost.py: an Intel Xeon, 2 cores)
over prompts built as `vllm bench serve`'s random dataset builds them (consecutive vocabulary ids
decoded to text, re-encoded to the length; 6-7 bytes a token): o200k (gpt-oss) 1.56-1.76 us at
1,024 tokens and 1.87-2.27 us at 8,192; Llama 3's vocabulary 1.59-1.61 and 1.65-2.14 us (two
runs; the median 1.7); natural text (license texts, 4.8 bytes a token) the same per token,
1.71-2.09 us. A measurement of the CPU here, not of the servers' CPUs."""

CUDA_CONTEXT_BYTES = 500 * units.BYTES_PER_MIB
"""CUDA context and allocator slack outside torch (vLLM counts it as non-torch memory). An
estimate; vLLM's startup log reports it inside "non_torch_memory"
(docs/cost-model.md#efficiency-constants)."""
NCCL_BUFFER_BYTES_TWO_GPUS = 544 * units.BYTES_PER_MB
"""NCCL buffers reported by vLLM for a 2-GPU communicator (vLLM's startup log counts them
as non-torch memory; an estimate, docs/cost-model.md#efficiency-constants)."""
NCCL_BUFFER_BYTES_LARGER = 688 * units.BYTES_PER_MB
"""NCCL buffers reported by vLLM for communicators of more than 2 GPUs (its startup log, as
NCCL_BUFFER_BYTES_TWO_GPUS; an estimate, docs/cost-model.md#efficiency-constants)."""
CUDA_GRAPH_BYTES = 1 * units.BYTES_PER_GIB
"""CUDA graph capture pool: about 0.5-1.5 GiB depending on vLLM version (an estimate;
docs/cost-model.md#efficiency-constants)."""
KV_BLOCK_SIZE_TOKENS = 16
"""vLLM allocates the KV cache in blocks of 16 tokens on CUDA (its default --block-size;
docs/cost-model.md#efficiency-constants)."""
PIPELINE_HOP_EXTRA_SECONDS = units.us_to_seconds(20)
"""Per pipeline hop at decode: scheduling and (de)serialising intermediate tensors
between vLLM's stage workers, on top of the link's alpha + S/beta. An estimate
(docs/cost-model.md#serving-pipeline, #efficiency-constants)."""

# ---------------------------------------------------------------- training (Megatron-LM)
# Owned by the training planner; see planner/train.py.

FLASH_ATTENTION_FORWARD_FRACTION_OF_PEAK = 0.73
"""Flash attention's forward kernel, share of the dense 16-bit peak: FlashAttention-2 on
A100 reaches up to 73% (Dao 2023, arXiv:2307.08691, sec. 4.1, head dim 128, long
sequences); FlashAttention-3 on H100 up to 75% (Shah et al. 2024, arXiv:2407.08608,
740 TFLOP/s of 989). Counted on the FLOPs the kernel runs (causal: half the square)."""
FLASH_ATTENTION_BACKWARD_FRACTION_OF_PEAK = 0.63
"""The backward kernel (FlashAttention-2 on A100: up to 63%, Dao 2023 sec. 4.1); used for
every GPU generation, FlashAttention-3 reporting the same or better ratios on H100."""


def flash_attention_fractions(measured_forward_fraction: float | None) -> tuple[float, float]:
    """(forward, backward) flash-attention shares of the dense 16-bit peak: the defaults above,
    or a GPU's measured forward share (catalog flash_attention_forward_fraction) with the
    backward scaled by the same factor (assumption: FlashAttention-2's backward/forward
    efficiency ratio 0.63/0.73 holds; AIConfigurator measures forward kernels only)."""
    if measured_forward_fraction is None:
        return FLASH_ATTENTION_FORWARD_FRACTION_OF_PEAK, FLASH_ATTENTION_BACKWARD_FRACTION_OF_PEAK
    ratio = FLASH_ATTENTION_BACKWARD_FRACTION_OF_PEAK / FLASH_ATTENTION_FORWARD_FRACTION_OF_PEAK
    return measured_forward_fraction, measured_forward_fraction * ratio


TRAIN_SUSTAINED_RATE_FRACTION = 0.93
"""The share of its kernels' rates a training step sustains: every compute and memory-bound
kernel rate the training estimate uses (the catalog's matmul and fp8 GEMM rates, the flash shares,
the elementwise HBM rate) is measured one kernel at a time (AIConfigurator's microbenchmarks, the
FlashAttention papers), and a step of thousands of back-to-back kernels runs them slower: clocks
fall under a whole node's sustained power draw, communication kernels overlapped with compute take
SMs and memory bandwidth, and kernel boundaries leave the GPU idle. Fitted
(`python bench/training_calibration.py --fit-sustained`) as the grid point (0.85-1.00 by 0.01) of
least median |error| over NeMo's 26 dense pre-training rows (H100 and B200, 8B-405B, fp8): median
|error| 7.0% -> 3.3%, within 10% 16 -> 25 of 26, mean +8% -> +1%. Held out (not fitted): NeMo's
long-sequence B200 rows 7.3% -> 1.5% (8K-1M tokens, attention up to 97% of the step, so not a
GEMM-only effect), Narayanan et al. 2021 Table 1 median +9.6% -> +2.7%, FlashAttention-2's A100
table +6..+11% -> -1..+3% (docs/cost-model.md#training-sustained-rates)."""
FA2_FORWARD_FRACTION_OF_PEAK_HOPPER = 0.35
"""FlashAttention-2's forward on H100: "only 35% utilization" of the dense 16-bit peak (Shah et
al. 2024, FlashAttention-3, arXiv:2407.08608, abstract and sec. 1: FA2 uses neither Hopper's
asynchronous wgmma nor TMA). `--attention-kernel fa2` prices it on compute capability 9.0 and
later (Blackwell's tcgen05 unused likewise: an estimate, no FA2 figure published there); the
backward at FlashAttention-2's own backward/forward ratio, as flash_attention_fractions does."""
FA2_SLOWER_FROM_COMPUTE_CAPABILITY = 9.0
"""Below it (Ampere, Ada) FlashAttention-2 is what the GPU's measured kernels are: no change
(FlashAttention-3 and cuDNN's fused attention need Hopper, compute capability 9.0; Shah et al.
2024, FlashAttention-3, sec. 1)."""


def flash_attention_forward_fraction(measured: float | None, kernel: str, compute_capability: float | None
                                     ) -> float | None:
    """The forward share flash_attention_fractions starts from: the catalog's measured one (None:
    its default), or with --attention-kernel fa2 on Hopper and later FlashAttention-2's published
    H100 share where that is lower."""
    if kernel != "fa2" or compute_capability is None or compute_capability < FA2_SLOWER_FROM_COMPUTE_CAPABILITY:
        return measured
    current = FLASH_ATTENTION_FORWARD_FRACTION_OF_PEAK if measured is None else measured
    return min(current, FA2_FORWARD_FRACTION_OF_PEAK_HOPPER)


FLASH_ATTENTION_MEASURED_HEAD_DIM = 128
"""The head dim every flash share above (and the catalog's) is measured at (the catalog's
flash rows and Dao 2023's benchmarks run d = 128; docs/cost-model.md#efficiency-constants)."""
FLASH_ATTENTION_HEAD_DIM_HALF = 55.0
"""d0 of flash_head_dim_factor where the catalog has none: H100's and H200's fit (both 55) to
AIConfigurator's context attention at d 64 against d 128 (docs/cost-model.md#efficiency-constants)."""


def flash_head_dim_factor(head_dim: float, half: float | None) -> float:
    """Flash attention's rate at head dim d over its rate at d = 128. Per score element the
    kernel runs 4d matmul FLOPs (q.k and p.v) and a fixed amount of softmax work (exp, running
    max, rescale) on the special-function units, which does not grow with d; so the share of the
    matmul peak goes as d / (d + d0), d0 the head dim at which the two cost the same (FlashAttention-3,
    Shah et al. 2024, sec. 3: the exponential's throughput is far below the matmuls').
    d0 fitted to AIConfigurator's fastest context-attention kernels at 8K, GQA 8:1, b 1-2, from
    the median d 64 / d 128 rate ratio (context_attention_head_dim.csv): H100 and H200 55 (ratio
    0.77), B200 319 (0.58: Blackwell doubled the tensor cores, not the exp units), L40S 32
    (0.83). Not above 1: head dims over 128 gain 0-16% on Hopper and Blackwell and lose on L40S
    (smaller shared memory), so none is assumed. d = 64, d0 = 55: (64/119) / (128/183) = 0.7689."""
    d0 = FLASH_ATTENTION_HEAD_DIM_HALF if half is None else half
    d_ref = FLASH_ATTENTION_MEASURED_HEAD_DIM
    return min(1.0, (head_dim / (head_dim + d0)) / (d_ref / (d_ref + d0)))


def attention_head_dim_factor(model: ModelSpec, gpu: GPU, multiply_adds_per_pair: float) -> float:
    """flash_head_dim_factor at one attention kind's head dim, the mean of its key and value
    widths (params.multiply_adds_per_attention_pair / 2a), with the GPU's d0; serving prices
    each kind with it, training its full-attention layers. gpt-oss (d 64) on H100: 0.7689."""
    head_dim = multiply_adds_per_pair / (2 * model.num_attention_heads)
    return flash_head_dim_factor(head_dim, gpu.flash_attention_head_dim_half)


FLASH_ATTENTION_BACKWARD_OVER_FORWARD_FLOPS = 2.5
"""The backward runs 5 matmuls of the forward's size (S = QK^T again, dV, dP, dQ, dK)
against the forward's 2 (Dao 2023, sec. 4.1 FLOP count)."""
CAUSAL_ATTENTION_FLOPS_FRACTION = 0.5
"""Flash kernels skip the fully masked blocks of a causal mask: about half the s x s work
(Dao 2023, sec. 3.1.1); materialized Megatron-LM kernels compute the whole square."""

EP_FOREIGN_PAIR_HBM_UTILIZATION = 0.60
"""Share of HBM bandwidth the fused-MoE op's per-pair buffer traffic for pairs routed to
other GPUs runs at under vLLM's all-gather EP path (serving_time.ep_foreign_pair_seconds):
row-scattered writes and reads. Fitted: the median over the 12 bf16 EP-8 balanced points of
>= 1,024 tokens of tests/fixtures/aiconfigurator_silicon/vllm_moe_h200.csv (AIConfigurator,
vLLM 0.24.0, H200; Mixtral-8x7B, Qwen3-235B-A22B, Qwen3-30B-A3B) of the share that closes
measured minus the op without it (0.30-0.74, with the own pairs' passes of
MoeKernel.pair_passes in the op; bench/moe_calibration.py
fit_ep_foreign_pair_utilization)."""

GEMM_HALF_RATE_DIMENSION = 128
"""A GEMM dimension at which the matmul runs at half its asymptotic rate. Tensor-core
GEMM kernels tile the output in 128-256 wide blocks over ~100-130 SMs: a dimension of
one tile (128) leaves most SMs or most of a tile idle (wave and tile quantization,
NVIDIA "Matrix Multiplication Background" guide). Modelled per dimension as x/(x + 128),
saturating toward the measured maximum achievable rate for large matrices. A GPU's catalog
gemm_half_rate_dimension wins (B200: 384, fitted to AIConfigurator's GEMMs; gpus.yaml)."""

def gemm_row_half(rate_flops_per_s: float, weight_bytes_per_element: float, weight_read_bytes_per_s: float) -> float:
    """The rows at which a serving GEMM runs at half its rate (u(M) = M / (M + this)):
    GEMM_HALF_RATE_DIMENSION, capped at the GPU's ridge in rows, M* = R b / (2 B) (R the
    matmul rate, b bytes per weight, B the weight-read rate): the M at which a GEMM's 2 M N K
    FLOPs at R take as long as reading its N K b bytes of weights. Below M* a kernel whose
    tile is shorter than 128 rows (split-K, swap-AB and GEMV kernels that libraries pick for
    skinny GEMMs) hides its padded rows behind the weight read, so the padding cannot cost
    more than one weight read. Binds only where compute per weight byte is low: H20 (148
    TFLOP/s over 4 TB/s, M* = 37), 8- and 4-bit weights on 16-bit GEMMs (W8A16 on A100:
    M* = 87; W4A16 Marlin: 81 on H100), and barely H200 at fp8 (1,080 TFLOP/s over 4.32 TB/s
    of weight stream: M* = 125); the other catalog GPUs have M* >= 152 at their serving GEMM
    precision. With the half-rate rows near M*, a decode step's GEMMs price 1 + M/M* weight
    reads (2NK(M + M*)/R), above the bare roofline max(read, compute) by up to 2x at M = M*:
    the decode calibration (H200 fp8 Llama-3.1-70B as benchmarked, TPOT +1% signed at
    4-64 clients) carries that shape, so it is kept. An estimate (no measurement of these
    GPUs' skinny GEMMs is at hand): without the cap H20's batch-1 decode came out
    compute-bound at 4x its weight-read time (docs/cost-model.md#serving-one-engine-step)."""
    ridge_rows = rate_flops_per_s * weight_bytes_per_element / (2 * weight_read_bytes_per_s)
    return min(float(GEMM_HALF_RATE_DIMENSION), ridge_rows)


ELEMENTWISE_HBM_UTILIZATION = 0.80
"""Share of datasheet HBM bandwidth that memory-bound elementwise kernels (layernorm,
softmax, dropout, GeLU, bias-add, residual) sustain: STREAM-like copies reach about
80-90% on A100/H100 (an estimate; docs/cost-model.md#efficiency-constants). A GPU's catalog
elementwise_hbm_utilization wins (H100 0.90, B200 0.55: AIConfigurator's fp8 cast kernel)."""



def elementwise_bytes_per_s(hbm_bytes_per_s: float, measured_utilization: float | None) -> float:
    """The HBM rate of memory-bound elementwise kernels: the GPU's measured share where the
    catalog has one, else ELEMENTWISE_HBM_UTILIZATION (serving and training alike)."""
    return hbm_bytes_per_s * (measured_utilization or ELEMENTWISE_HBM_UTILIZATION)


ELEMENTWISE_BWD_OVER_FWD = 2.0
"""Backward elementwise kernels read the stored input and the incoming gradient and
write the outgoing gradient: about twice the forward traffic (a byte count, not a fit;
docs/cost-model.md#efficiency-constants)."""


MAIN_GRAD_ACCESSES_PER_MICRO_BATCH = 2
"""Per micro-batch, Megatron accumulates weight gradients into the main_grad buffers: each
element read and written once (gradient-accumulation fusion puts it in the wgrad GEMM
epilogue; the traffic remains): 8 B/param with fp32 main gradients, 4 with
--grad-reduce bf16 (GRADIENT_BYTES_PER_PARAM)."""

OPTIMIZER_STEP_BYTES_PER_PARAM = 30
"""Adam step, memory-bound: read fp32 grad (4), read+write fp32 master, m, v (24),
write the 16-bit weight (2) (Megatron mixed-precision optimizer). Other optimizer states:
training_memory.optimizer_step_bytes_per_param."""
OPTIMIZER_STEP_GRADIENT_READ_BYTES = 4
"""The Adam step reads each main gradient as fp32 (OPTIMIZER_STEP_BYTES_PER_PARAM's 4)."""

TRAIN_BYTES_PER_PARAM_WEIGHTS = 2
"""16-bit model weights (Megatron-LM docs/api-guide/dist_optimizer.md)."""
GRADIENT_BYTES_PER_PARAM = {"fp32": 4, "bf16": 2}
"""Main-gradient buffer bytes per parameter by --grad-reduce: fp32 (Megatron's default for
bf16 training, accumulate_allreduce_grads_in_fp32) or bf16 (--grad-reduce-in-bf16: the buffer
in the parameters' dtype, megatron/core/distributed/param_and_grad_buffer.py core_v0.19.0,
grad_dtype = torch.float if grad_reduce_in_fp32 else param.dtype)."""
TRAIN_BYTES_PER_PARAM_GRADIENTS = GRADIENT_BYTES_PER_PARAM["fp32"]
"""Megatron keeps fp32 main gradients (and reduces them in fp32) by default
(accumulate_allreduce_grads_in_fp32 with --bf16: megatron/training/arguments.py core_v0.19.0)."""
TRAIN_BYTES_PER_PARAM_OPTIMIZER = 12
"""Adam: fp32 master weights, first and second moments (4 + 4 + 4; Megatron-LM
docs/api-guide/dist_optimizer.md)."""
ADAM_MOMENTS_BYTES_PER_PARAM = {"fp32": 8, "bf16": 4}
"""Adam's first and second moments by --optimizer-states: fp32 (Megatron's default) or bf16
(--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16: Transformer
Engine's FusedAdam keeps exp_avg and exp_avg_sq in bf16; megatron/training/arguments.py and
megatron/core/optimizer/__init__.py, core_v0.14.0 and core_v0.19.0)."""
MASTER_WEIGHT_BYTES_PER_PARAM = 4
"""The fp32 master weights of mixed-precision Adam (Megatron's main params)."""
MASTER_REMAINDER_BYTES_PER_PARAM = 2
"""The precision-aware optimizer's master weights where Transformer Engine keeps them for bf16
weights (bf16, or fp8 with delayed scaling, under the distributed optimizer): only the low 16
bits of each fp32 master weight, whose high 16 bits are the bf16 weight itself
(OptimizerConfig.store_param_remainders, default True with TE >= 2.1; FusedAdam's
store_param_remainders)."""
FSDP2_BYTES_PER_PARAM_WEIGHTS = 4
"""torchtitan's FSDP2 (ZeRO-3): the sharded parameters are fp32, built in training.dtype
(default "float32", torchtitan/config/job_config.py v0.2.2) and themselves the optimizer's
master copy; the 16-bit weights exist only as the gathered units (fsdp_unit_buffer_bytes)."""
FSDP2_BYTES_PER_PARAM_OPTIMIZER = 8
"""torchtitan's FSDP2: Adam's first and second moments (4 + 4, torch.optim.AdamW's exp_avg and
exp_avg_sq in the parameters' fp32); no separate master copy."""
AUTOCAST_WEIGHT_COPY_BYTES_PER_PARAM = 2
"""torchtitan's DDP (and one GPU): fp32 parameters under torch.autocast (maybe_enable_amp,
torchtitan/distributed/utils.py v0.2.2), whose bf16 casts of the weights each matmul saves for
its backward: one 16-bit copy of every weight held from the forward to the backward."""

TRAIN_ALLOCATOR_FRAGMENTATION_FRACTION = 0.10
"""PyTorch caching-allocator slack on activation memory, which is allocated and freed
every micro-batch (reserved over allocated is commonly 5-15% in Megatron runs; an
estimate, not a measurement: docs/cost-model.md#efficiency-constants)."""
TRAIN_WORKSPACE_BYTES = 1 * units.BYTES_PER_GIB
"""cuBLAS/cuDNN workspaces and communication staging buffers beyond NCCL's own. An estimate
(docs/cost-model.md#efficiency-constants)."""

# ---------------------------------------------------------------- training in fp8 (Transformer Engine)

TRAIN_FP8_WEIGHT_CACHE_BYTES_PER_PARAM = 2
"""Per linear-layer weight with --precision fp8: Transformer Engine quantizes each GEMM
weight on the first micro-batch and keeps it for the rest of the step (linear.py,
`cache_name="weight"` unless is_first_microbatch is None; Megatron passes it), 1 byte,
plus the column-wise (transposed) fp8 copy the dgrad GEMM needs on Hopper and Ada, whose
fp8 GEMMs take only the TN layout (TE docs, features/low_precision_training/
fp8_current_scaling "Transpose handling"; TransformerEngine v2.9). Blackwell shares one
layout (1 byte) but the planner counts 2 for every GPU: the larger, Hopper's."""
TRAIN_FP8_CAST_TRANSPOSE_BYTES_PER_ELEMENT = 4
"""Transformer Engine's fused cast-transpose of a 16-bit tensor that no earlier kernel
quantized (tensor-wise fp8, delayed scaling): read 2 bytes, write the row-wise fp8 copy (1)
for the fprop or dgrad GEMM and the column-wise one (1) for the wgrad GEMM; the amax is
taken in the same pass (transformer_engine/common/transpose/cast_transpose.cu; used from
module/linear.py `input_quantizer(inputmat)` and `grad_output_preprocess`, v2.18)."""
TRAIN_FP8_TRANSPOSE_BYTES_PER_ELEMENT = 2
"""TE's fp8 transpose of a tensor a fused kernel already quantized row-wise (the layernorm
output of LayerNormLinear, which the norm kernel writes in fp8 with delayed scaling:
csrc/extensions/normalization.cpp Impl::FULLY_FUSED, v2.18): read 1 byte, write 1."""
TRAIN_FP8_AMAX_BYTES_PER_ELEMENT = 2
"""Current (tensor-wise) scaling's extra pass: the amax of a 16-bit tensor must be known before
its cast (Float8CurrentScalingQuantizer: one read, 2 bytes; the layernorm kernel writes its
16-bit output and amax, Impl::FUSED_NORM_AMAX_FP8, and a separate cast follows). Priced by
fp8_cast_bytes_per_layer(recipe="tensorwise") for --fp8-recipe tensorwise."""
TRAIN_MXFP8_BLOCK_ELEMENTS = 32
"""MXFP8BlockScaling (--fp8-recipe mxfp8): one E8M0 scale (1 byte) per 1x32 block of
consecutive values, along the rows for the row-wise copy and along the columns for the
column-wise one (TransformerEngine v2.18: common/recipe/__init__.py MXFP8BlockScaling;
pytorch/constants.py MXFP8_BLOCK_SCALING_SIZE = 32; pytorch/tensor/mxfp8_tensor.py
get_scale_shape: row-wise scale_inv [rows, cols/32], column-wise [rows/32, cols], uint8)."""
TRAIN_MXFP8_COPY_BYTES_PER_ELEMENT = 1 + 1 / TRAIN_MXFP8_BLOCK_ELEMENTS
"""One MXFP8 copy of a tensor: the fp8 value (1 byte) and its share of the block's scale (1/32)."""
TRAIN_MXFP8_CAST_BYTES_PER_ELEMENT = 2 + 2 * TRAIN_MXFP8_COPY_BYTES_PER_ELEMENT
"""TE's MXFP8 quantize of a 16-bit tensor that both GEMM directions use (an input: fprop
row-wise, wgrad column-wise; an output gradient: dgrad row-wise, wgrad column-wise): read 2
bytes, write both copies with their scales, 2 * (1 + 1/32) = 4.0625 B/element in all. Both
copies come from the 16-bit input in one pass (the recipe's docstring: "both versions are
computed from the high precision input to avoid double quantization errors"), the block amax
inside the kernel: no amax pass, no history. The layernorm outputs too: v2.18's
csrc/extensions/normalization.cpp runs the norm UNFUSED for MXFP8 quantizers (FULLY_FUSED
only with NVTE_NORM_FWD_USE_CUDNN set), so the norm writes 16-bit (already in the elementwise
traffic) and this quantize follows."""
TRAIN_MXFP8_WEIGHT_CACHE_BYTES_PER_PARAM = 2 * TRAIN_MXFP8_COPY_BYTES_PER_ELEMENT
"""Per linear-layer weight with --fp8-recipe mxfp8: the row-wise (fprop) and column-wise
(dgrad) MXFP8 copies with their scales, 2.0625 bytes. Unlike tensor-wise fp8 on Blackwell the
two are not one tensor read two ways: the blocks run along different dimensions."""
TRAIN_FP8_BLOCKWISE_COPY_BYTES_PER_ELEMENT = 1 + 4 / 128
"""Float8BlockScaling (--fp8-recipe blockwise): one fp32 scale (4 bytes) per 1x128 block of an
activation or gradient, along the rows for the row-wise copy and along the columns for the
column-wise one (TransformerEngine v2.18: common/recipe/__init__.py Float8BlockScaling,
x_block_scaling_dim = grad_block_scaling_dim = 1, w_block_scaling_dim = 2; block length 128):
1 + 4/128 = 1.03125 bytes per element per copy."""
TRAIN_FP8_BLOCKWISE_CAST_BYTES_PER_ELEMENT = 2 + 2 * TRAIN_FP8_BLOCKWISE_COPY_BYTES_PER_ELEMENT
"""TE's block-wise quantize of a 16-bit tensor both GEMM directions use: read 2 bytes, write
both copies computed from the 16-bit input (the recipe's docstring: "both versions are
computed from the high precision input to avoid double quantization errors"), the block amax
inside the kernel: 2 + 2 * 1.03125 = 4.0625 B/element, no amax pass, no history."""
TRAIN_FP8_BLOCKWISE_WEIGHT_CACHE_BYTES_PER_PARAM = 2 * (1 + 4 / (128 * 128))
"""Per linear-layer weight with --fp8-recipe blockwise: the row-wise and column-wise fp8
copies, one fp32 scale per 128x128 block each: 2.0005 bytes."""
TRAIN_FP8_BLOCKWISE_GEMM_RATE_RATIO = 0.97
"""Block-scaled fp8 GEMMs (per-block scales, split accumulation in all three GEMMs) over the
per-tensor fp8 rate: AIConfigurator's TRT-LLM 1.3.0rc20 fp8_block against fp8 latencies at the
Llama-3.1-8B/70B fprop and dgrad shapes, M 4096-16384, tp 1-8 on H100 (102 points of
tests/fixtures/aiconfigurator_silicon/training_gemm.csv; aiconfigurator-core 0.12.0): median
0.973. Used on every GPU (the fixture has no Blackwell block-scaled point)."""
TRAIN_FP8_SAVED_INPUT_BYTES_PER_ELEMENT = 1
"""TE saves a linear layer's input for its wgrad GEMM as the quantized fp8 tensor, not the
16-bit one (linear.py `saved_inputmat = inputmat`, row-wise data discarded when only the
column-wise copy is needed; TransformerEngine v2.9)."""
TRAIN_FP8_AMAX_HISTORY_LEN = 1024
"""--fp8-amax-history-len the planner emits (the delayed-scaling window NeMo's GPT recipes
use with amax_compute_algo max). Each GEMM keeps fp32 amax histories for 3 forward
tensors and 2 backward ones (TE docs, fp8_delayed_scaling.rst: shapes
(amax_history_len, num_gemms * 3) and (amax_history_len, num_gemms * 2)) and a scale each."""
TRAIN_FP8_SCALING_BYTES_PER_GEMM = (3 + 2) * 4 * (TRAIN_FP8_AMAX_HISTORY_LEN + 2)
"""fp32 amax history + scale + scale-inverse of the 5 fp8 tensors of one GEMM: 20 KiB
(delayed scaling only: current scaling keeps a one-element scale and amax per quantizer,
MXFP8 its scales inside the tensors; neither has a history, both counted as 0)."""


EXPERT_LOAD_IMBALANCE = 1.35
"""Routed work on the busiest GPU of an EP group over the mean (whole experts per GPU): the
fused MoE op's latency under skewed routing over its latency under balanced routing, where
it is compute-bound. Source: AIConfigurator's measured vLLM 0.24.0 kernels on H200
(aiconfigurator-core 0.12.0, systems/data/h200_sxm/moe/vllm/0.24.0/moe_perf.parquet; rows in
tests/fixtures/aiconfigurator_silicon/vllm_moe_h200.csv): bf16 Triton kernel, moe_tp 1,
moe_ep 8, num_tokens 4096/8192/16384, median ratio power_law_1.2 / balanced 1.44 for
Qwen3-235B-A22B's shape (h 4096, f 1536, E 128, e 8) and 1.26 for Qwen3-30B-A3B's
(2048/768/128/8): their median, 1.35. power_law with alpha 1.2 is AIConfigurator's default
routing for its MoE searches (sdk/config.py workload_distribution "power_law",
sdk/models/moe.py alpha 1.2; DeepSeek models 1.01, which gives 1.32 and 1.25 here). It grows
as fewer experts share a GPU: Mixtral-8x7B at EP 8 (one expert per GPU) measures 2.45
(--expert-imbalance). bench/moe_calibration.py prints the table;
tests/serve/test_moe_calibration.py re-derives the value."""

MOE_LAYER_FORWARD_HOST_SECONDS = units.ms_to_seconds(6.1)
"""H: the host's time to issue one dropless MoE block's forward in Megatron's eager mode (its
attention, router, token permutation, dispatch, expert GEMMs and combine, as Python, PyTorch
and Transformer Engine issue them one kernel at a time), which the GPU waits out where its own
forward of the block is shorter (training_time.moe_host_exposed_seconds: each MoE layer syncs
the host on its token counts, so the host cannot run ahead of it). Fitted by
bench/moe_host_fit.py: the grid point (6-8 ms by 0.1) of least median |error| over the 34 NeMo
MoE pre-training rows (tests/fixtures/nemo_moe_training_perf.csv: NVIDIA's Megatron-Bridge
performance archive, DeepSeek-V3, GPT-OSS-120B, Qwen3-30B-A3B and Qwen3-235B-A22B on DGX-H100
and DGX-B200, each priced with its recipe's dispatcher, all-to-all overlap and recompute, at
TRAIN_SUSTAINED_RATE_FRACTION): 10.8% median |error| (41% without it), 21 of 34 within 15% (14).
The curve is flat: 6.0-7.5 ms all give 10.8-12.8% (7.3 ms, the fit before the sustained
fraction, 12.5% and 23 within 15%). Each model family held out in turn (fitted on the other
three): 9-24%. The sign of a host-bound step in those rows:
Qwen3-30B on 8 B200 runs 9,299-9,691 tokens/s per GPU at micro-batch 1 and 26,695-27,136 at
micro-batch 4, 2.8x for 4x the tokens per kernel. One number for every model and GPU: it does
not follow a model's kernel count (GPT-OSS's and MLA's blocks issue more) or the host CPU, and
the rows ran parts of some blocks in CUDA graphs (Qwen3-30B on B200: the router and the
permutation's preprocessing, from 26.04 the attention too), which the planner's commands do not."""

DEEPEP_FIXED_SECONDS = {
    "deepep_low_latency": (units.us_to_seconds(16.8), units.us_to_seconds(5.6)),
    "deepep_high_throughput": (units.us_to_seconds(41.2), units.us_to_seconds(31.8)),
}
"""(a, b) of DeepEP's fixed cost per dispatch or combine over an EP group on N nodes,
a + b log2(N), whatever the bytes: the low-latency kernels' launch and arrival flags; the
high-throughput ones' notify phase too (a handshake of the per-rank token counts, which grows
with the nodes). Fitted by bench/deepep_calibration.py on AIConfigurator's measured DeepEP
(aiconfigurator-core 0.12.0, SGLang 0.5.6.post2 wideep collection on H200, 1-8 nodes; rows in
tests/fixtures/aiconfigurator_silicon/sglang_deepep_multinode.csv): least squares of the median
of the rows of at most 4 tokens per node count (low latency 14.7, 24.9, 29.2, 32.0 us at 1, 2, 4,
8 nodes; high throughput 42.9, 71.1, 103.5, 138.1 us). SGLang's collector times the kernels as a
CUDA graph replays them; vLLM's own collection (vllm_deepep_a2a_h200.csv, through its
prepare/finalize wrappers, outside a graph) sits 30-40 us higher at one node."""
DEEPEP_NVLINK_UTILIZATION = 0.64
"""Share of the datasheet NVLink bandwidth DeepEP's traffic to the node's other GPUs moves at:
the median over the one-node rows where the bytes dominate (same fit, same rows): 0.641 (low
latency 0.47-0.59, high throughput 0.57-0.71 by phase and size)."""
DEEPEP_RDMA_UTILIZATION = 0.93
"""Share of one GPU's NIC line rate DeepEP's traffic leaving the node moves at: the median over
the rows of 2, 4 and 8 nodes where the bytes dominate (same fit, same rows): 0.934, about 47
GB/s of a 400 Gb/s NIC (high throughput across 8 nodes runs at half that in these rows)."""


def deepep_fixed_seconds(backend: str, num_nodes: int) -> float:
    """DEEPEP_FIXED_SECONDS of `backend` over `num_nodes` nodes: a + b log2(N)."""
    a, b = DEEPEP_FIXED_SECONDS[backend]
    return a + b * math.log2(max(1, num_nodes))


ALLTOALL_FIXED_SECONDS = units.us_to_seconds(43)
"""Fixed cost of one DeepEP dispatch or combine inside a node beyond the alpha-beta model's
(g-1) link latencies: a kernel launch and every rank waiting on its peers' arrival flags
(a GPU-side barrier over the EP group), whatever the bytes. Fitted as the median of measured
minus comm.group_alltoall_seconds over DeepEP's low-latency rows of 1-32 tokens (h 3072 and
7168, e 8, E 256, EP 8 on one H200 node; aiconfigurator-core 0.12.0,
systems/data/h200_sxm/comm/vllm/0.24.0/moe_a2a_perf.parquet; rows in
tests/fixtures/aiconfigurator_silicon/vllm_deepep_a2a_h200.csv): 42.8 us; the measured floor
is 51-54 us. It takes the low-latency rows of up to 256 tokens from -78% to +2% median error
(bench/moe_calibration.py). comm.alltoall_seconds adds it to every modelled all-to-all
(training's Megatron dispatcher; serving prices vLLM's all-gather and reduce-scatter)."""
