"""Anchor: FlashAttention-2's end-to-end training table (Dao 2023, arXiv:2307.08691, sec. 4.2,
Table 1): GPT-3-style models of 1.3B and 2.7B parameters trained on one node of 8 A100-80GB SXM4
(NVLink), FlashAttention-2 column, in TFLOP/s per GPU counted as 6 * s * N + 12 * L * h * s^2 per
sequence (N the parameters; the attention term counts the whole s x s square, forward and
backward). The only A100 training anchor with flash attention (the Narayanan et al. rows run
materialized attention).

The runs (flash-attention's training/configs/experiment/pile at 0251105a, the repository the
paper's table comes from): GPT-2-style blocks (LayerNorm, biases, learned positions of the
sequence length, GELU 4h MLP, tied embeddings, vocab 50,257 padded to a multiple of 8 = 50,264),
bf16, no activation checkpointing, data parallelism over the 8 GPUs with the optimizer states
sharded (DDPStrategyZero1); global batch 512 sequences at 2K, 128 at 8K; micro-batch 8
(1.3B at 2K) and 4 (the rest) on 80 GB GPUs (gpt3xl-flash.yaml, gpt3xl-flash-8k.yaml,
gpt3-2.7B-flash.yaml: 32 heads of 80). The planner prices each as that layout (tp = pp = 1,
dp = 8, ZeRO-1, its micro-batch, no recompute, flash attention), and the published rate becomes
tokens/s by the paper's own count. Tolerance 15%. Today +3%, -1%, -1%, at the share of its
kernels' rates a training step sustains (efficiency.TRAIN_SUSTAINED_RATE_FRACTION, fitted to
NVIDIA's H100 and B200 rows, not to these); before it the planner was optimistic on all three
(+6% to +11%), as on NVIDIA's rows.

Left out: GPT3-2.7B at 8K (225 TFLOP/s). Its config's micro-batch 4 without checkpointing needs
124.6 GiB per GPU in the planner (activations 34 s b h bytes a layer, 91 GiB at b = 4, as
Korthikanti et al. count them), so the paper's run cannot have used it as written; which
micro-batch it ran is not published.
"""

from __future__ import annotations

import pytest

from planner.catalog import resolve_cluster
from planner.requests import LayoutFilter, TrainRequest
from planner.specs import ModelSpec
from planner.train_search import search

VOCAB = 50_264
TABLE_1 = [  # name, hidden, layers, heads, seq len, global batch, micro-batch, TFLOP/s per GPU (FA2)
    ("GPT3-1.3B 2k", 2048, 24, 16, 2048, 512, 8, 196),
    ("GPT3-1.3B 8k", 2048, 24, 16, 8192, 128, 4, 220),
    ("GPT3-2.7B 2k", 2560, 32, 32, 2048, 512, 4, 205),
]


def gpt(name: str, hidden: int, layers: int, heads: int, seq_len: int) -> ModelSpec:
    return ModelSpec(
        name=name, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
        intermediate_size=4 * hidden, gated_mlp=False, attention_bias=True, mlp_bias=True,
        norm_type="layernorm", position_embedding="learned", vocab_size=VOCAB,
        max_position_embeddings=seq_len, tie_word_embeddings=True, dtype="bfloat16",
    )


def paper_flops_per_token(hidden: int, layers: int, seq_len: int) -> float:
    """The paper's count per token: 6N + 12 L h s, N = V h + s h (positions) + L (12 h^2 + 13 h)
    + 2h (final LayerNorm)."""
    params = VOCAB * hidden + seq_len * hidden + layers * (12 * hidden**2 + 13 * hidden) + 2 * hidden
    return 6 * params + 12 * layers * hidden * seq_len


def test_the_paper_s_count_by_hand():
    """GPT3-1.3B at 2K: N = 50,264 * 2048 + 2048 * 2048 + 24 * (12 * 2048^2 + 13 * 2048) + 4096 =
    102,940,672 + 4,194,304 + 1,208,598,528 + 4,096 = 1,315,737,600; per token 6N =
    7,894,425,600 plus 12 * 24 * 2048 * 2048 = 1,207,959,552: 9,102,385,152 FLOP. 196 TFLOP/s
    per GPU is then 21,533 tokens/s per GPU (172,264 on the node)."""
    assert paper_flops_per_token(2048, 24, 2048) == 7_894_425_600 + 1_207_959_552 == 9_102_385_152
    assert 196e12 / 9_102_385_152 == pytest.approx(21_533, abs=1)


@pytest.mark.parametrize("row", TABLE_1, ids=[row[0] for row in TABLE_1])
def test_flash_attention2_row_within_15_percent(row):
    name, hidden, layers, heads, seq_len, global_batch, micro_batch, tflops = row
    request = TrainRequest(global_batch=global_batch, seq_len=seq_len, layout=LayoutFilter(tp=1, pp=1),
                           micro_batch=micro_batch, recompute="none", zero_stage=1)
    plan = search(gpt(name, hidden, layers, heads, seq_len), resolve_cluster("1x8xA100"), request)
    assert plan.layouts, f"{name}: the published configuration does not fit"
    published = tflops * 1e12 / paper_flops_per_token(hidden, layers, seq_len)  # tokens/s per GPU
    predicted = plan.layouts[0].tokens_per_second / 8
    assert predicted == pytest.approx(published, rel=0.15)
