"""Training calibration: the planner's tokens/s per GPU against NVIDIA's NeMo framework
(Megatron-Bridge) performance summary, dense Llama pre-training on DGX-H100 and DGX-B200.

    python bench/training_calibration.py              # per row, per group and overall, on stdout
    python bench/training_calibration.py --json       # the summary as JSON (rows included)
    python bench/training_calibration.py --csv PATH   # another set with the same columns
    python bench/training_calibration.py --moe        # the MoE rows, each as its recipe ran it
    python bench/training_calibration.py --moe --moe-dispatcher auto       # as the planner would run them
    python bench/training_calibration.py --vs-best    # each published configuration against the planner's best

Every row of the set (tests/fixtures/nemo_training_perf.csv, provenance in
tests/fixtures/README.md) is one published pre-training run: `spec` on num_gpus GPUs of the
row's system, its global batch, micro-batch, sequence length and tp x pp x cp (vp, fsdp). The
planner estimates exactly that configuration (planner.train.estimate):

- cluster `{num_gpus // 8}x8x{H100|B200}` from the GPU catalog;
- dp = num_gpus / (tp * pp * cp); schedule interleaved with v = vp when vp > 1, else 1F1B;
- ZeRO-3 (Megatron-FSDP, optim_grads_params) when fsdp > 0, else the distributed optimizer
  (ZeRO-1) when dp * cp > 1, else none; sequence parallelism when tp > 1;
- flash attention; precision fp8 for every fp8 row with its recipe (Row.fp8_recipe, FP8_RECIPES): "fp8
  current scaling" -> tensorwise, "fp8 mxfp8" -> mxfp8, "fp8 (recipe not stated)" -> delayed
  (Megatron-LM's default --fp8-recipe, and the recipe NeMo's GPT configs shipped before
  current scaling); bf16 main gradients for the Megatron-Bridge containers and NeMo 24.07's
  Nemotron-4 340B (grad_reduce_for), whose bf16 Adam moments are priced too (optimizer_states_for);
- recompute none (the published recipes recompute nothing, except the H100 8B FP8-CS one at
  25.11: full recompute of 5 of its 32 layers, Megatron's --recompute-method block
  --recompute-num-layers 5, priced as that: RECIPE_BLOCK_RECOMPUTE). A row that does
  not fit without recompute is re-estimated with outputs (MoE and MLA models: Megatron's
  output-discarding checkpoints, which the GPT-OSS and DeepSeek-V3 recipes run), selective,
  then full; the row says which.

The MoE rows (tests/fixtures/nemo_moe_training_perf.csv, --moe: DeepSeek-V3, GPT-OSS-120B,
Qwen3-30B-A3B and Qwen3-235B-A22B from the same archive) add the row's ep (Megatron's
--expert-model-parallel-size, experts unsplit: --expert-tensor-parallel-size 1) and routing
balanced as published ("In MoE training benchmarks, we force-balance the token distribution
among experts and all benchmarks are token-dropless": --expert-imbalance 1). By default each is
priced as its Megatron-Bridge recipe ran it (the fixture's recipe_* columns, read at the
container's tag): its token dispatcher (HybridEP priced as DeepEP, RECIPE_DISPATCHER), its
all-to-all overlap (Megatron's combined 1F1B where the recipe turns it on) and its recompute as
the first level tried (RECIPE_RECOMPUTE). `--moe-dispatcher auto|alltoall|deepep` prices every
row with that dispatcher instead, without the overlap (unless --moe-comm-overlap) and from
recompute none: `auto` is what the planner itself would run. One constant is fitted to these
rows, Megatron's host time per MoE block forward (bench/moe_host_fit.py).

Error = predicted / published - 1 (+0.10: the planner says 10% faster than measured).
Importable: `load_rows(path)`, `predict(row)`, `score(rows)`; no I/O in them. Not part of the
planner.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from planner import units  # noqa: E402
from planner.catalog import resolve_cluster, resolve_model  # noqa: E402
from planner.emit.megatron import refusals as megatron_refusals  # noqa: E402
from planner.engines import MEGATRON_RELEASES  # noqa: E402
from planner.layout import Rejected, TrainConfig  # noqa: E402
from planner.requests import ATTENTION_KERNELS, MOE_DISPATCHERS, LayoutFilter, TrainRequest  # noqa: E402
from planner.specs import ClusterSpec, ModelSpec  # noqa: E402
from planner.train import TrainEstimate, estimate  # noqa: E402
from planner.train_search import RECOMPUTE_ORDER, search  # noqa: E402

FIXTURE = REPO / "tests/fixtures/nemo_training_perf.csv"
MOE_FIXTURE = REPO / "tests/fixtures/nemo_moe_training_perf.csv"
LONG_CONTEXT_FIXTURE = REPO / "tests/fixtures/nemo_long_context_perf.csv"
ATTENTION_KERNEL = "auto"
"""The --attention-kernel rows are priced with by default (score's `attention_kernel`, this
script's --attention-kernel): auto, the kernel the engine picks at the GPU's measured rate; fa2,
FlashAttention-2's published Hopper share."""
NEMO_VOCAB_SIZES = {"llama2": 32000, "llama3": 128256}
"""LLM_VOCAB_SIZE_MAP (nemo/collections/common/parts/perf_metrics_utils.py at NVIDIA/NeMo 811bd0e6),
the vocabulary NeMo's FLOPs formulas count for each family."""
MOE_COMM_OVERLAP = False
"""Megatron's combined 1F1B for the MoE rows: off (module docstring); --moe-comm-overlap turns
it on where Megatron can run it."""
MOE_DISPATCHER = "recipe"
"""The MoE rows' token dispatcher: "recipe", each row's as its Megatron-Bridge recipe ran it
(with its all-to-all overlap and, as the first level tried, its recompute), or a
TrainRequest.moe_dispatcher for every row ("auto": the planner's own choice)."""
RECIPE_DISPATCHER = {"alltoall": "alltoall", "deepep": "deepep", "hybridep": "deepep"}
"""A recipe's dispatcher -> the planner's: HybridEP (NVIDIA's flex backend, one copy of a token
per node hit as DeepEP, on 32 SMs in these recipes) is priced as DeepEP, the nearest it has."""
RECIPE_RECOMPUTE = {"none": "none", "selective layernorm moe_act": "outputs", "selective mla_up_proj": "outputs",
                    "selective mla_up_proj mlp": "outputs"}
"""A recipe's recompute -> the first planner level tried: Megatron's output-discarding modules
are the planner's "outputs" (which discards moe_act, layernorm and, for MLA, mla_up_proj;
DeepSeek-V3's mlp module, its dense layers' MLP, has no level)."""
RECIPE_BLOCK_RECOMPUTE = re.compile(r"full block (\d+) of \d+ layers")
"""A dense recipe's block recompute ("full block 5 of 32 layers"): priced as recompute full with
recompute_num_layers 5, from the first level tried (a published setting, not a search)."""
BALANCED_ROUTING = 1.0
"""--expert-imbalance of the MoE rows: NeMo's MoE benchmarks force-balance the routing."""
GPUS_PER_NODE = 8
"""DGX-H100 and DGX-B200: 8 GPUs per node."""
SYSTEM_GPU = {"DGX-H100": "H100", "DGX-B200": "B200"}
FP8_RECIPES = {"fp8 current scaling": "tensorwise", "fp8 mxfp8": "mxfp8", "fp8 (recipe not stated)": "delayed"}
"""Published fp8 precision -> --fp8-recipe; an fp8 label not here raises (KeyError)."""
RECOMPUTE_LEVELS = RECOMPUTE_ORDER
"""The levels tried in turn, least recompute first (the search's order)."""
UNLIMITED_GIB = 10_000.0
"""GPU memory for the what-if estimates: no configuration is out of memory."""
BREAKDOWN_KEYS = ("compute", "bubble", "tp_comm", "pp_comm", "dp_comm_exposed", "cp_comm", "ep_comm", "host")


@dataclass(frozen=True)
class Row:
    """One published pre-training run (a fixture row)."""

    id: str
    container: str
    system: str
    model: str
    spec: str
    num_gpus: int
    global_batch: int
    micro_batch: int
    seq_len: int
    tp: int
    pp: int
    cp: int
    vp: int
    ep: int
    fsdp: int
    precision: str
    """As published: "fp8 current scaling", "fp8 mxfp8", "fp8 (recipe not stated)", "bf16"."""
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    source_url: str
    recipe_recompute: str = ""
    """What the row's Megatron-Bridge recipe recomputes (MoE rows; RECIPE_RECOMPUTE)."""
    recipe_dispatcher: str = ""
    """The recipe's token dispatcher: alltoall, deepep or hybridep (MoE rows; "" for dense)."""
    recipe_a2a_overlap: str = ""
    """on / off: the recipe's --overlap-moe-expert-parallel-comm (MoE rows)."""

    @property
    def dp(self) -> int:
        return self.num_gpus // (self.tp * self.pp * self.cp)

    @property
    def planner_precision(self) -> str:
        return "fp8" if self.precision.startswith("fp8") else "bf16"

    @property
    def fp8_recipe(self) -> str | None:
        """The planner's --fp8-recipe for the published precision (module docstring)."""
        if self.planner_precision != "fp8":
            return None
        return FP8_RECIPES[self.precision]

    @property
    def group(self) -> str:
        return f"{self.spec} {SYSTEM_GPU[self.system]}"


def degree(cell: str) -> int:
    """A published degree: "n/a" (and the blank of a table without that column) is 1."""
    return 1 if cell.strip() in ("", "n/a") else int(cell)


def parse_row(row: dict[str, str]) -> Row:
    """A fixture row as a Row; a missing or malformed cell raises (nothing is skipped)."""
    if None in row or None in row.values():
        raise ValueError(f"row {row.get('model')!r}: {len(row)} cells, not one per column")
    key = f"{row['container']} {row['system']} {row['model']} {row['precision']}"
    return Row(
        id=key, container=row["container"], system=row["system"], model=row["model"], spec=row["spec"],
        num_gpus=int(row["num_gpus"]), global_batch=int(row["gbs"]), micro_batch=int(row["mbs"]),
        seq_len=int(row["seq_len"]), tp=degree(row["tp"]), pp=degree(row["pp"]), cp=degree(row["cp"]),
        vp=degree(row["vp"]), ep=degree(row["ep"]), fsdp=0 if row["fsdp"].strip() in ("", "n/a") else int(row["fsdp"]),
        precision=row["precision"], tokens_per_s_per_gpu=float(row["tokens_per_s_per_gpu"]),
        model_tflops_per_gpu=float(row["model_tflops_per_gpu"]), source_url=row["source_url"],
        recipe_recompute=row.get("recipe_recompute", ""), recipe_dispatcher=row.get("recipe_dispatcher", ""),
        recipe_a2a_overlap=row.get("recipe_a2a_overlap", ""),
    )


def load_rows(path: Path = FIXTURE) -> list[Row]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [parse_row(row) for row in csv.DictReader(handle)]


def nemo_model_flops_per_token(model: ModelSpec, seq_len: int, formula: str) -> float:
    """The model FLOPs per token NeMo's TFLOP/s columns count for its llama2 and llama3 formulas
    (nemo/utils/flops_formulas.py at NVIDIA/NeMo 811bd0e6, 2025-04-15, the code of both
    long-sequence tables' containers): L h^2 (12 + 12 g/a + 18 f/h + 12 s/h + 6 V/(L h)) with g the
    KV heads, f the FFN size and V the family's vocabulary (NEMO_VOCAB_SIZES): forward and backward
    of the GEMMs, and the attention core over the whole s x s square (the causal discount came
    later: "Discount FLOPs in dot-product att", 6251117, 2025-08-09). Llama-2-7B at 4,096 tokens:
    32 x 4096^2 x (12 + 12 + 48.375 + 12 + 1.46484375) = 46,084,915,200 per token."""
    L, h = model.num_hidden_layers, model.hidden_size
    g, a, f = model.num_key_value_heads, model.num_attention_heads, model.intermediate_size
    vocab = NEMO_VOCAB_SIZES[formula]
    return L * h * h * (12 + 12 * g / a + 18 * f / h + 12 * seq_len / h + 6 * vocab / (L * h))


def load_long_context_rows(path: Path = LONG_CONTEXT_FIXTURE) -> list[Row]:
    """NeMo's long-sequence rows (tests/fixtures/nemo_long_context_perf.csv), which publish model
    TFLOP/s per GPU only: tokens/s per GPU = TFLOP/s / nemo_model_flops_per_token."""
    rows = []
    with path.open(newline="", encoding="utf-8") as handle:
        for cells in csv.DictReader(handle):
            seq_len = int(cells["seq_len"])
            flops = nemo_model_flops_per_token(resolve_model(cells["spec"]), seq_len, cells["nemo_flops_formula"])
            tokens = units.tflops_to_flops_per_s(float(cells["model_tflops_per_gpu"])) / flops
            row = parse_row({**cells, "tokens_per_s_per_gpu": str(tokens)})
            rows.append(replace(row, id=f"{row.container} {row.system} {row.model} {seq_len // 1024}K "
                                        f"tp{row.tp} pp{row.pp} cp{row.cp} dp{row.dp}"))
    return rows


def config_for(row: Row, recompute: str) -> TrainConfig:
    """The published configuration in the planner's vocabulary (module docstring); recompute
    full with the recipe's block count where it names one (RECIPE_BLOCK_RECOMPUTE)."""
    block = RECIPE_BLOCK_RECOMPUTE.fullmatch(row.recipe_recompute)
    interleaved = row.vp > 1
    if row.fsdp > 0:
        zero_stage = 3
    else:
        zero_stage = 1 if row.dp * row.cp > 1 else 0
    return TrainConfig(
        tp=row.tp, pp=row.pp, dp=row.dp, cp=row.cp, micro_batch_size=row.micro_batch,
        schedule="interleaved" if interleaved else "1f1b", virtual_stages=row.vp if interleaved else 1,
        recompute=recompute, sequence_parallel=row.tp > 1, zero_stage=zero_stage,
        precision=row.planner_precision, ep=row.ep,
        recompute_num_layers=int(block.group(1)) if block and recompute == "full" else None,
    )


def cluster_for(row: Row, memory_gib: float | None = None) -> ClusterSpec:
    """The row's nodes from the GPU catalog; `memory_gib` replaces the GPU's memory (the
    what-if that shows the time of a configuration the planner finds out of memory)."""
    nodes, per_node = max(1, row.num_gpus // GPUS_PER_NODE), min(GPUS_PER_NODE, row.num_gpus)  # 2-4 GPUs: one node
    cluster = resolve_cluster(f"{nodes}x{per_node}x{SYSTEM_GPU[row.system]}")
    if memory_gib is None:
        return cluster
    gpu = cluster.gpu.model_copy(update={"memory_gib": memory_gib, "cuda_visible_memory_gib": memory_gib})
    return cluster.model_copy(update={"gpu": gpu})


def estimate_row(row: Row, recompute: str, virtual_stages: int | None = None,
                 memory_gib: float | None = None, moe_dispatcher: str = MOE_DISPATCHER,
                 attention_kernel: str = ATTENTION_KERNEL) -> TrainEstimate | Rejected:
    """`virtual_stages` replaces the row's vp (the nearest expressible interleaving);
    `moe_dispatcher` the MoE rows' dispatcher."""
    config = config_for(row, recompute)
    if virtual_stages is not None:
        config = replace(config, virtual_stages=virtual_stages,
                         schedule="interleaved" if virtual_stages > 1 else "1f1b")
    return estimate(resolve_model(row.spec), cluster_for(row, memory_gib), config,
                    request_for(row, moe_dispatcher, attention_kernel))


def request_for(row: Row, moe_dispatcher: str = MOE_DISPATCHER, attention_kernel: str = ATTENTION_KERNEL
                ) -> TrainRequest:
    """The row's workload and the settings it was priced with (module docstring); no layout."""
    overlap = MOE_COMM_OVERLAP
    if moe_dispatcher == "recipe":
        overlap = overlap or row.recipe_a2a_overlap == "on"
        moe_dispatcher = RECIPE_DISPATCHER.get(row.recipe_dispatcher, "auto")
    return TrainRequest(global_batch=row.global_batch, seq_len=row.seq_len, precision=row.planner_precision,
                        fp8_recipe=row.fp8_recipe, grad_reduce=grad_reduce_for(row),
                        optimizer_states=optimizer_states_for(row), attention_kernel=attention_kernel,
                        expert_imbalance=BALANCED_ROUTING if row.ep > 1 else None,
                        moe_comm_overlap=overlap, moe_dispatcher=moe_dispatcher)


def versus_best(row: Row, moe_dispatcher: str = MOE_DISPATCHER) -> dict:
    """The published configuration against the planner's own best for the same workload on the
    same GPUs (train_search.search with the row's settings, every layout, micro-batch,
    schedule, recompute level and ZeRO stage), both priced by the planner: `gap` = best / the
    published configuration's estimate - 1 (0: the planner would run what NVIDIA ran, or
    something no faster). The statistic issue 12 keeps: the published configuration within
    15% of the planner's best. Not scored against the measurement."""
    published = predict(row, moe_dispatcher)
    plan = search(resolve_model(row.spec), cluster_for(row), request_for(row, moe_dispatcher))
    out = {"id": row.id, "group": row.group, "published_config": published_config_text(row)}
    if "rejected" in published or not plan.layouts:
        return {**out, "gap": None, "why": "the published configuration does not fit in the planner"
                if "rejected" in published else "nothing fits"}
    best = plan.layouts[0]
    c = best.config
    return {**out, "gap": best.tokens_per_second / row.num_gpus / published["predicted_tokens_per_s_per_gpu"] - 1,
            "published_recompute": published["recompute"],
            "best_config": (f"tp{c.tp} cp{c.cp} pp{c.pp} dp{c.dp} ep{c.ep} b{c.micro_batch_size} "
                            f"{c.schedule}{'/' + str(c.virtual_stages) if c.schedule == 'interleaved' else ''} "
                            f"{c.recompute_label} zero{c.zero_stage}")}


def published_config_text(row: Row) -> str:
    vp = f" v{row.vp}" if row.vp > 1 else ""
    return f"tp{row.tp} cp{row.cp} pp{row.pp}{vp} dp{row.dp} ep{row.ep} b{row.micro_batch} fsdp{row.fsdp}"


def print_versus_best(rows: list[dict]) -> None:
    print(f"{'row':<52} {'published':<36} {'planner best':<52} {'gap':>6}")
    for r in rows:
        gap = "-" if r["gap"] is None else percent(r["gap"])
        best = r.get("best_config", r.get("why", ""))
        print(f"{r['id'][:52]:<52} {r['published_config'][:36]:<36} {best[:52]:<52} {gap:>6}")
    gaps = [r["gap"] for r in rows if r["gap"] is not None]
    if gaps:
        print(f"\npublished configuration within 15% of the planner's best: {sum(g <= 0.15 for g in gaps)} of "
              f"{len(rows)} rows ({len(rows) - len(gaps)} not compared); median gap {percent(statistics.median(gaps))}, "
              f"largest {percent(max(gaps))}")


NEMO_BF16_OPTIMIZER_MODELS = ("Nemotron-340B",)
"""NeMo 24.07 rows whose launcher config keeps the optimizer in bf16: NeMo-Framework-Launcher
tag 24.07, launcher_scripts/conf/training/nemotron/nemotron_340b.yaml, optim
distributed_fused_adam with grad_sync_dtype bf16 and dtype bf16 (every version of that file
through 2025-01 says so; its Llama configs leave both at the fp32 default)."""


def grad_reduce_for(row: Row) -> str:
    """bf16 main gradients but on the long-sequence rows. The Megatron-Bridge containers (25.09 on): their Llama 3
    perf scripts set mixed_precision.grad_reduce_in_fp32 = ddp.grad_reduce_in_fp32 = False
    (NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/llama/llama3_llm_pretrain.py,
    set_llama3_common_configs). NeMo 24.07: Nemotron-4 340B's launcher config says
    grad_sync_dtype bf16 (NEMO_BF16_OPTIMIZER_MODELS), and the Llama runs' scripts
    (NeMo-Framework-Launcher tag 24.07, examples/training/llama/h100/llama{2_7b,2_13b,2_70b,
    3_8b,3_70b}_fp8.sh: the table's global batch 128, fp8) add
    +training.model.optim.grad_sync_dtype=bf16 to configs that leave it at apex's fp32 default
    (session 59 read the configs alone and priced fp32: the 8B at cp 2 then needed full
    recompute, 12.2 GiB over at none). The long-sequence rows (24.03.01) reduce in fp32, as
    before: no script of theirs was read."""
    if row.container.startswith("24.") and row.container != "24.07":
        return "fp32"
    return "bf16"


BRIDGE_BF16_OPTIMIZER_MODELS = ("DeepSeekV3",)
"""MoE rows whose Megatron-Bridge recipe keeps Adam's moments in bf16: DeepSeek-V3's
(src/megatron/bridge/recipes/deepseek/deepseek_v3.py at every tag from v0.1.0rc3 to v0.5.0:
use_precision_aware_optimizer, exp_avg_dtype = exp_avg_sq_dtype = bfloat16, main_params_dtype
float32, main_grads_dtype bfloat16)."""


def optimizer_states_for(row: Row) -> str:
    """bf16 Adam moments, priced as Megatron's precision-aware optimizer (--optimizer-states bf16),
    for NeMo 24.07's Nemotron-4 340B (NEMO_BF16_OPTIMIZER_MODELS) and the DeepSeek-V3 MoE rows
    (BRIDGE_BF16_OPTIMIZER_MODELS); fp32 (Megatron's default) elsewhere. NeMo 24.07 ran apex's
    DistributedFusedAdam with dtype bf16, which keeps no master copy at all when the optimizer's
    dtype is the model's (NeMo megatron_base_model.py, r2.0.0rc1: store_params False): 4 bytes a
    parameter where the planner prices 6. Left out: Megatron-Bridge's performance scripts turn the
    precision-aware optimizer on for every bf16 run (scripts/performance/utils/overrides.py,
    set_post_overrides, v0.3.0-v0.5.0), with fp32 moments outside DeepSeek-V3, whose master
    weights as remainders (10 bytes a parameter, not 12) the planner has no flag for."""
    if row.container.startswith("24."):
        return "bf16" if row.model in NEMO_BF16_OPTIMIZER_MODELS else "fp32"
    return "bf16" if row.model.startswith(BRIDGE_BF16_OPTIMIZER_MODELS) else "fp32"


def error_of(row: Row, result: TrainEstimate | Rejected) -> float | None:
    if isinstance(result, Rejected):
        return None
    return result.tokens_per_second / row.num_gpus / row.tokens_per_s_per_gpu - 1


def what_ifs(row: Row, recompute: str | None, moe_dispatcher: str = MOE_DISPATCHER,
             attention_kernel: str = ATTENTION_KERNEL) -> dict:
    """Diagnostics, never scored: the error at recompute none with the memory limit lifted
    (when the planner needed recompute or rejected the row), and at the largest v below the
    row's that the planner can split the layers for (when it cannot split them for vp)."""
    out = {}
    if recompute != "none":
        out["error_no_recompute_if_memory_fit"] = error_of(row, estimate_row(row, "none", memory_gib=UNLIMITED_GIB,
                                                                             moe_dispatcher=moe_dispatcher,
                                                                             attention_kernel=attention_kernel))
    if recompute is None:
        for v in range(row.vp - 1, 0, -1):
            result = estimate_row(row, "none", virtual_stages=v, memory_gib=UNLIMITED_GIB,
                                  moe_dispatcher=moe_dispatcher, attention_kernel=attention_kernel)
            if not isinstance(result, Rejected):
                out["nearest_virtual_stages"] = v
                out["error_at_nearest_v_if_memory_fit"] = error_of(row, result)
                break
    return out


def breakdown_shares(result: TrainEstimate) -> dict[str, float]:
    """Each component of the step as a share of the step time."""
    parts = result.time_breakdown_seconds
    return {key: getattr(parts, key) / parts.total for key in BREAKDOWN_KEYS}


def predict(row: Row, moe_dispatcher: str = MOE_DISPATCHER, attention_kernel: str = ATTENTION_KERNEL) -> dict:
    """The estimate at the first recompute level that fits (RECOMPUTE_LEVELS from none, or from
    the row's recipe's level with moe_dispatcher "recipe"): the predicted tokens/s per GPU and
    the error, or every level's rejection."""
    rejections = {}
    first = RECIPE_RECOMPUTE.get(row.recipe_recompute, "none") if moe_dispatcher == "recipe" else "none"
    if RECIPE_BLOCK_RECOMPUTE.fullmatch(row.recipe_recompute):
        first = "full"  # the recipe's block recompute, as published
    for recompute in RECOMPUTE_LEVELS[RECOMPUTE_LEVELS.index(first):]:
        result = estimate_row(row, recompute, moe_dispatcher=moe_dispatcher, attention_kernel=attention_kernel)
        if isinstance(result, Rejected):
            rejections[recompute] = "; ".join(result.reasons)
            continue
        predicted = result.tokens_per_second / row.num_gpus
        return {
            "id": row.id, "group": row.group, "precision": row.precision, "fp8_recipe": result.config.fp8_recipe,
            "recompute": result.config.recompute_label,
            "rejected_without": rejections, "published_tokens_per_s_per_gpu": row.tokens_per_s_per_gpu,
            "predicted_tokens_per_s_per_gpu": predicted,
            "error": predicted / row.tokens_per_s_per_gpu - 1,
            "predicted_mfu": result.mfu, "step_seconds": result.step_time_seconds,
            "memory_gib": units.bytes_to_gib(result.memory_per_gpu_bytes),
            "breakdown_share": breakdown_shares(result), **what_ifs(row, recompute, moe_dispatcher, attention_kernel),
        }
    return {"id": row.id, "group": row.group, "precision": row.precision, "rejected": rejections,
            **what_ifs(row, None, moe_dispatcher, attention_kernel)}


def error_stats(errors: list[float]) -> dict[str, float]:
    """Median |error|, rows within 10% and 15%, mean and median signed error (fractions)."""
    magnitudes = [abs(e) for e in errors]
    return {"num_rows": len(errors), "median_abs": statistics.median(magnitudes), "max_abs": max(magnitudes),
            "within_10": sum(m <= 0.10 for m in magnitudes), "within_15": sum(m <= 0.15 for m in magnitudes),
            "mean_signed": statistics.fmean(errors), "median_signed": statistics.median(errors)}


def precision_family(precision: str) -> str:
    if precision.startswith("bf16"):
        return "bf16"
    return "fp8 mxfp8" if "mxfp8" in precision else "fp8 (per-tensor)"


def summarize(scored: list[dict], key) -> dict:
    names = sorted({key(r) for r in scored})
    return {name: error_stats([r["error"] for r in scored if key(r) == name]) for name in names}


def score(rows: list[Row], moe_dispatcher: str = MOE_DISPATCHER, attention_kernel: str = ATTENTION_KERNEL) -> dict:
    """Every row predicted (`moe_dispatcher`: the MoE rows' token dispatcher); statistics
    overall, by precision and by group (model x GPU)."""
    results = [predict(row, moe_dispatcher, attention_kernel) for row in rows]
    scored = [r for r in results if "rejected" not in r]
    return {
        "num_rows": len(rows),
        "num_scored": len(scored),
        "rejected": [r for r in results if "rejected" in r],
        "overall": error_stats([r["error"] for r in scored]) if scored else {},
        "by_precision": summarize(scored, lambda r: precision_family(r["precision"])),
        "by_group": summarize(scored, lambda r: r["group"]),
        "rows": scored,
    }


def percent(fraction: float, sign: str = "+") -> str:
    return f"{100 * fraction:{sign}.0f}%"


def print_rows(rows: list[dict]) -> None:
    shares = "  ".join(f"{k[:7]:>7}" for k in BREAKDOWN_KEYS)
    print(f"{'row (share of the predicted step ->)':<52} {'recomp':<9} {'pred':>7} {'publ':>7} {'error':>6}   {shares}")
    for r in rows:
        cells = "  ".join(f"{percent(r['breakdown_share'][k], ''):>7}" for k in BREAKDOWN_KEYS)
        print(f"{r['id'][:52]:<52} {r['recompute']:<9} {r['predicted_tokens_per_s_per_gpu']:7.0f} "
              f"{r['published_tokens_per_s_per_gpu']:7.0f} {percent(r['error']):>6}   {cells}")


def stats_line(name: str, stats: dict) -> str:
    return (f"{name:<28} {stats['num_rows']:>4} {percent(stats['median_abs'], ''):>8} "
            f"{percent(stats['max_abs'], ''):>6} {stats['within_10']:>5} {stats['within_15']:>5} "
            f"{percent(stats['mean_signed']):>7} {percent(stats['median_signed']):>7}")


def print_report(summary: dict) -> None:
    print_rows(summary["rows"])
    print(f"\n{'group':<28} {'rows':>4} {'|err|med':>8} {'max':>6} {'<=10%':>5} {'<=15%':>5} "
          f"{'mean':>7} {'median':>7}")
    for name, stats in {**summary["by_precision"], **summary["by_group"]}.items():
        print(stats_line(name, stats))
    if summary["overall"]:
        print(stats_line("overall", summary["overall"]))
    print(f"\n{summary['num_scored']} of {summary['num_rows']} rows scored; "
          f"{len(summary['rejected'])} rejected at every recompute level")
    for r in summary["rows"]:
        if r["rejected_without"]:
            level, why = next(iter(r["rejected_without"].items()))
            print(f"  {r['id']}: recompute {level} rejected ({why}); fits with "
                  f"{r['recompute']}; with the memory limit lifted, recompute none would be "
                  f"{percent(r['error_no_recompute_if_memory_fit'])}")
    for r in summary["rejected"]:
        reasons = sorted(set(r["rejected"].values()))
        print(f"  rejected {r['id']} at every recompute level: {'; '.join(reasons)}")
        if "nearest_virtual_stages" in r:
            print(f"    (not scored) at v={r['nearest_virtual_stages']}, recompute none, memory limit lifted: "
                  f"{percent(r['error_at_nearest_v_if_memory_fit'])}")


OLD_MEGATRON = MEGATRON_RELEASES["core_v0.14.0"]
"""The release whose startup checks the without-CP look keeps (without_cp_rows: its refusals)."""


def without_cp_rows(attention_kernel: str = ATTENTION_KERNEL, path: Path = LONG_CONTEXT_FIXTURE,
                    recompute: str | None = None, only: str | None = None) -> list[dict]:
    """A look, not a calibration: each long-sequence row's "Without CP" column (the best NVIDIA
    found without context parallelism; its layout is not published) against the planner's own
    best for the same workload with cp = 1 (train_search.search, LayoutFilter(cp=1)), both in
    tokens/s per GPU through NeMo's FLOPs count. `gap` = planner's best / NVIDIA's - 1. The
    planner's best is the first of its rows Megatron core_v0.14.0 would start (OLD_MEGATRON), as
    the containers' Megatron-Core (0.5-0.12) would: tp must divide the query groups (Llama 3 8B: 8), which NVIDIA's footnote names
    as what kept 1M tokens from running without CP; core_v0.19.0 would allow tp 16-32.
    `recompute`: fixes the level (--recompute; "full" recomputes every layer, no block count);
    `only`: the one row id to look at (None: every row)."""
    out = []
    with path.open(newline="", encoding="utf-8") as handle:
        cells = list(csv.DictReader(handle))
    for row, cell in zip(load_long_context_rows(path), cells, strict=True):
        if only is not None and row.id != only:
            continue
        if not cell["without_cp_model_tflops_per_gpu"]:
            out.append({"id": row.id, "gap": None, "why": "no run without CP fitted the GPUs (published)"})
            continue
        model = resolve_model(row.spec)
        published = (units.tflops_to_flops_per_s(float(cell["without_cp_model_tflops_per_gpu"]))
                     / nemo_model_flops_per_token(model, row.seq_len, cell["nemo_flops_formula"]))
        request = replace(request_for(row, attention_kernel=attention_kernel), layout=LayoutFilter(cp=1),
                          recompute=recompute)
        plan = search(model, cluster_for(row), request)
        runs = [e for e in plan.layouts if not megatron_refusals(model, e.config, OLD_MEGATRON)]
        if not runs:
            out.append({"id": row.id, "gap": None, "why": "nothing fits without CP in the planner"})
            continue
        c = runs[0].config
        predicted = runs[0].tokens_per_second / row.num_gpus
        out.append({"id": row.id, "published_tokens_per_s_per_gpu": published, "predicted_tokens_per_s_per_gpu": predicted,
                    "gap": predicted / published - 1,
                    "best_config": f"tp{c.tp} pp{c.pp} dp{c.dp} b{c.micro_batch_size} {c.recompute_label} zero{c.zero_stage}"})
    return out


SUSTAINED_GRID = tuple(round(0.85 + 0.01 * i, 2) for i in range(16))
"""0.85 to 1.00 by 0.01: the grid --fit-sustained scores."""


def fit_sustained(grid: tuple[float, ...] = SUSTAINED_GRID) -> dict:
    """The fit of efficiency.TRAIN_SUSTAINED_RATE_FRACTION: each grid point set as the constant
    (train_rates reads it per call) and the dense rows (FIXTURE) scored; the fraction is the
    point of least median |error| (ties: the larger, the less derated). Held out, at each point:
    the long-sequence rows of the containers whose kernels the catalog's rates are (B200 25.04,
    LONG_CONTEXT_FIXTURE). The constant is restored afterwards."""
    from planner.cost import efficiency

    saved = efficiency.TRAIN_SUSTAINED_RATE_FRACTION
    dense, held_out = load_rows(FIXTURE), [r for r in load_long_context_rows() if r.system == "DGX-B200"]
    points = []
    try:
        for fraction in grid:
            efficiency.TRAIN_SUSTAINED_RATE_FRACTION = fraction
            fitted = score(dense)["overall"]
            held = score(held_out)["overall"]
            points.append({"fraction": fraction, **fitted, "held_out": held})
    finally:
        efficiency.TRAIN_SUSTAINED_RATE_FRACTION = saved
    best = min(points, key=lambda p: (round(p["median_abs"], 6), -p["fraction"]))
    return {"grid": points, "best_fraction": best["fraction"]}


def print_fit_sustained(result: dict) -> None:
    print(f"{'fraction':>8}   {'dense rows: |err| med':>21} {'<=10%':>5} {'<=15%':>5} {'mean':>7}   "
          f"{'held out (B200 long): |err| med':>31} {'mean':>7}")
    for p in result["grid"]:
        h = p["held_out"]
        print(f"{p['fraction']:8.2f}   {percent(p['median_abs'], ''):>21} {p['within_10']:5d} {p['within_15']:5d} "
              f"{percent(p['mean_signed']):>7}   {percent(h['median_abs'], ''):>31} {percent(h['mean_signed']):>7}")
    print(f"\nbest: {result['best_fraction']:.2f} (efficiency.TRAIN_SUSTAINED_RATE_FRACTION)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", type=Path, default=FIXTURE, help="rows to score (default: the fixture)")
    parser.add_argument("--moe", action="store_true", help="score the MoE rows (tests/fixtures/"
                        "nemo_moe_training_perf.csv) instead; bench/moe_host_fit.py fits the MoE host time to them")
    parser.add_argument("--moe-dispatcher", choices=("recipe", *MOE_DISPATCHERS), default=MOE_DISPATCHER,
                        help="the MoE rows' token dispatcher (default: each row's recipe's, with its "
                        "all-to-all overlap and recompute; auto: the planner's choice)")
    parser.add_argument("--moe-comm-overlap", action="store_true",
                        help="price the MoE rows with Megatron's combined 1F1B where it can run")
    parser.add_argument("--vs-best", action="store_true", help="also each published configuration against the "
                        "planner's own best for the same workload (both priced by the planner)")
    parser.add_argument("--long-context", action="store_true", help="score NeMo's long-sequence rows "
                        "(tests/fixtures/nemo_long_context_perf.csv: Llama-2-7B on H100 at 4K-1M tokens, NeMo "
                        "24.03.01; Llama-3-8B on B200 at 8K-1M, 25.04.rc2; context parallelism) instead")
    parser.add_argument("--attention-kernel", choices=ATTENTION_KERNELS, default="auto",
                        help="the flash-attention kernel every row is priced with (the planner's --attention-kernel)")
    parser.add_argument("--without-cp", action="store_true", help="a look, not a calibration: NeMo's long-sequence "
                        "'Without CP' column against the planner's best at cp=1 (its layout unpublished)")
    parser.add_argument("--fit-sustained", action="store_true", help="the fit of the share of its kernels' rates "
                        "a training step sustains (efficiency.TRAIN_SUSTAINED_RATE_FRACTION) over the dense rows, "
                        "with NeMo's B200 long-sequence rows held out")
    parser.add_argument("--json", action="store_true", help="the summary as JSON")
    args = parser.parse_args()
    if args.without_cp:
        looked = without_cp_rows(args.attention_kernel)
        if args.json:
            print(json.dumps(looked, indent=2))
            return
        for r in looked:
            gap = "-" if r["gap"] is None else percent(r["gap"])
            print(f"{r['id'][:52]:<52} {r.get('best_config', r.get('why', '')):<42} {gap:>6}")
        return
    if args.fit_sustained:
        result = fit_sustained()
        print(json.dumps(result, indent=2)) if args.json else print_fit_sustained(result)
        return
    global MOE_COMM_OVERLAP
    MOE_COMM_OVERLAP = args.moe_comm_overlap
    if args.long_context:
        rows = load_long_context_rows()
    else:
        rows = load_rows(MOE_FIXTURE if args.moe else args.csv)
    if args.vs_best:
        compared = [versus_best(row, args.moe_dispatcher) for row in rows]
        if args.json:
            print(json.dumps(compared, indent=2))
        else:
            print_versus_best(compared)
        return
    summary = score(rows, args.moe_dispatcher, args.attention_kernel)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_report(summary)


if __name__ == "__main__":
    main()
