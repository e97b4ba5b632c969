"""Anchor: every row of Narayanan et al. 2021 (SC21, "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM"), Table 1: GPT models (vocab 51200, seq 2048,
4h MLP, fp16, full recomputation) on DGX A100-80GB nodes (8 GPUs, NVSwitch, 8 x 200 Gb/s HDR
InfiniBand), measured teraFLOP/s per GPU counted with eq. 3 (96*B*s*L*h^2*(1 + s/(6h) +
V/(16*L*h)) per step over GPUs and time).

The planner fixes each row's t and p, full recompute, no sequence parallelism, no
distributed optimizer and materialized attention (none of flash attention, SP or the
distributed optimizer existed in the 2021 code) and searches the rest (micro-batch,
schedule, virtual stages). Tolerance 15%: the model's precision. The
model is not fitted to these rows: today, at the share of its kernels' rates a training step
sustains (efficiency.TRAIN_SUSTAINED_RATE_FRACTION, fitted to NVIDIA's NeMo rows), it runs -14%
(1.7B) to +7%, median +3% (before that share -7% to +14%, median +10%, optimistic on the larger
ones, where the search picks the best micro-batch and interleaving the paper may not have used).
"""

from __future__ import annotations

import pytest

from planner.catalog import resolve_cluster
from planner.requests import LayoutFilter, TrainRequest
from planner.specs import ModelSpec
from planner.train_search import search

TABLE_1 = [  # params, hidden, layers, heads, t, p, GPUs, global batch, measured TFLOP/s/GPU
    ("1.7B", 2304, 24, 24, 1, 1, 32, 512, 137),
    ("3.6B", 3072, 30, 32, 2, 1, 64, 512, 138),
    ("7.5B", 4096, 36, 32, 4, 1, 128, 512, 142),
    ("18B", 6144, 40, 48, 8, 1, 256, 1024, 135),
    ("39B", 8192, 48, 64, 8, 2, 512, 1536, 138),
    ("76B", 10240, 60, 80, 8, 4, 1024, 1792, 140),
    ("145B", 12288, 80, 96, 8, 8, 1536, 2304, 148),
    ("310B", 16384, 96, 128, 8, 16, 1920, 2160, 155),
    ("530B", 20480, 105, 128, 8, 35, 2520, 2520, 163),
    ("1T", 25600, 128, 160, 8, 64, 3072, 3072, 163),
]


def gpt(name: str, hidden: int, layers: int, heads: int) -> ModelSpec:
    return ModelSpec(
        name=f"gpt-{name}", num_hidden_layers=layers, hidden_size=hidden,
        num_attention_heads=heads, intermediate_size=4 * hidden, gated_mlp=False,
        attention_bias=True, mlp_bias=True, norm_type="layernorm",
        position_embedding="learned", vocab_size=51200, max_position_embeddings=2048,
        tie_word_embeddings=True, dtype="float16",
    )


@pytest.mark.parametrize("row", TABLE_1, ids=[row[0] for row in TABLE_1])
def test_table1_row_within_15_percent(row):
    name, hidden, layers, heads, tp, pp, num_gpus, global_batch, measured = row
    request = TrainRequest(
        global_batch=global_batch, seq_len=2048, layout=LayoutFilter(tp=tp, pp=pp),
        recompute="full", sequence_parallel=False if tp > 1 else None, zero_stage=0, attention="materialized",
    )
    plan = search(gpt(name, hidden, layers, heads), resolve_cluster(f"{num_gpus // 8}x8xA100"), request)
    assert plan.layouts, f"{name}: no feasible configuration for t={tp}, p={pp}"
    assert plan.layouts[0].tflops_per_gpu == pytest.approx(measured, rel=0.15)
