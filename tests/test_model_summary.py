"""model_summary: the model's facts every plan states once (JSON `model_summary`, the
table's header line), pinned to hand-worked arithmetic and published sizes.

Llama-3.1-8B (planner/model_specs/llama-3.1-8b.yaml): L=32, h=4096, a=32 heads, k=8 KV
heads, d=128, f=14336 (SwiGLU), V=128256, untied, bfloat16. Per layer:
  Q = O = h*a*d = 4096*32*128 = 16,777,216
  K + V = 2*h*k*d = 2*4096*8*128 = 8,388,608
  MLP = 3*h*f = 3*4096*14336 = 176,160,768
  norms (2 RMSNorms) = 2*4096 = 8,192
  block = 2*16,777,216 + 8,388,608 + 176,160,768 + 8,192 = 218,112,000
"""

from __future__ import annotations

import json

import pytest

from planner.catalog import resolve_model
from planner.model_summary import attention_kind, model_summary

LLAMA8_ARGS = ("--model", "llama-3.1-8b", "--cluster", "1x8xH100")
TRAIN_ARGS = ("--workload", "train", "--global-batch", "64", "--seq-len", "4096")


def test_dense_llama_8b_counts_by_hand() -> None:
    """total = L*block + embedding V*h + head V*h + final norm h
    = 32*218,112,000 + 2*128256*4096 + 4096 = 6,979,584,000 + 1,050,673,152 + 4,096
    = 8,030,261,248 (the model card's 8.03B); dense, so active = total, no MTP."""
    s = model_summary(resolve_model("llama-3.1-8b"))
    assert s.total_params == 8_030_261_248
    assert s.active_params == s.total_params
    assert s.mtp_params == 0
    assert (s.num_experts, s.experts_per_token, s.num_shared_experts, s.num_moe_layers) == (0, 0, 0, 0)
    assert s.attention == "gqa"
    assert s.weight_dtype == "bfloat16"


def test_dense_llama_8b_kv_bytes_per_token_by_hand() -> None:
    """2 (K, V) * L * k * d * bytes = 2*32*8*128*2 = 131,072 B at bfloat16 (auto);
    fp8 halves it: 2*32*8*128*1 = 65,536 B."""
    model = resolve_model("llama-3.1-8b")
    auto, fp8 = model_summary(model), model_summary(model, "fp8")
    assert (auto.kv_cache_bytes_per_token, auto.kv_cache_dtype) == (131_072, "bfloat16")
    assert (fp8.kv_cache_bytes_per_token, fp8.kv_cache_dtype) == (65_536, "fp8")


def test_deepseek_v3_against_published_sizes() -> None:
    """DeepSeek-V3 tech report: 671B total, 37B activated per token (MTP module beside it).
    MLA caches the latent and the RoPE key: (r_kv + d_rope) * L * bytes = (512 + 64) * 61 * 2
    = 70,272 B per token at bf16. 256 routed experts, top-8, 1 shared, in 61 - 3 dense = 58
    layers; fp8 weights."""
    s = model_summary(resolve_model("deepseek-v3"))
    assert s.total_params == pytest.approx(671e9, rel=0.02)
    assert s.active_params == pytest.approx(37e9, rel=0.05)
    assert s.mtp_params > 0
    assert (s.kv_cache_bytes_per_token, s.kv_cache_dtype) == (70_272, "bfloat16")
    assert (s.num_experts, s.experts_per_token, s.num_shared_experts, s.num_moe_layers) == (256, 8, 1, 58)
    assert s.attention == "mla"
    assert s.weight_dtype == "fp8"


@pytest.mark.parametrize(("name", "experts", "top", "layers"), [
    ("mixtral-8x7b", 8, 2, 32),
    ("qwen3-30b-a3b", 128, 8, 48),
])
def test_moe_experts(name: str, experts: int, top: int, layers: int) -> None:
    """Mixtral-8x7B: 8 experts, 2 per token, every one of 32 layers MoE; Qwen3-30B-A3B: 128,
    8 per token, all 48 layers; both GQA, no shared expert, active well under total."""
    s = model_summary(resolve_model(name))
    assert (s.num_experts, s.experts_per_token, s.num_shared_experts, s.num_moe_layers) == (experts, top, 0, layers)
    assert s.attention == "gqa"
    assert s.active_params < s.total_params / 2


def test_attention_kind_by_kv_heads() -> None:
    """k = a: MHA (GPT-3: 96 of 96); k = 1: MQA; 1 < k < a: GQA; a KV latent: MLA."""
    llama = resolve_model("llama-3.1-8b")
    assert attention_kind(resolve_model("gpt3-175b")) == "mha"
    assert attention_kind(llama.model_copy(update={"num_key_value_heads": 1})) == "mqa"
    assert attention_kind(llama) == "gqa"
    assert attention_kind(resolve_model("deepseek-v3")) == "mla"


def test_quantized_weight_dtype() -> None:
    """An AWQ checkpoint's block matmuls are int4; its dtype stays float16/bfloat16."""
    assert model_summary(resolve_model("llama-3.1-70b-awq")).weight_dtype == "int4"


def test_every_json_output_carries_the_same_summary(run_plan_many) -> None:
    """serve --mode auto (aggregated + disaggregated), --mode aggregated, --mode
    disaggregated and train: one model_summary, with llama-3.1-8b's 8,030,261,248 params."""
    done = run_plan_many({
        "auto": (*LLAMA8_ARGS, "--json"),
        "aggregated": (*LLAMA8_ARGS, "--mode", "aggregated", "--json"),
        "disaggregated": (*LLAMA8_ARGS, "--mode", "disaggregated", "--json"),
        "train": (*LLAMA8_ARGS, *TRAIN_ARGS, "--json"),
    })
    summaries = {}
    for case, result in done.items():
        assert result.returncode == 0, (case, result.stderr)
        summaries[case] = json.loads(result.stdout)["model_summary"]
    assert {s["total_params"] for s in summaries.values()} == {8_030_261_248}
    assert summaries["auto"] == summaries["aggregated"] == summaries["disaggregated"] == summaries["train"]
    assert summaries["auto"]["kv_cache_bytes_per_token"] == 131_072


def test_json_summary_follows_the_serve_kv_dtype(run_plan) -> None:
    """--kv-cache-dtype fp8 halves the KV bytes: 65,536 B per token for llama-3.1-8b."""
    done = run_plan(*LLAMA8_ARGS, "--mode", "aggregated", "--kv-cache-dtype", "fp8", "--json")
    summary = json.loads(done.stdout)["model_summary"]
    assert (summary["kv_cache_bytes_per_token"], summary["kv_cache_dtype"]) == (65_536, "fp8")


@pytest.mark.parametrize("extra", [(), TRAIN_ARGS], ids=["serve", "train"])
def test_table_header_shows_total_and_active(run_plan, extra) -> None:
    """The header line reads the same summary: 671.03B total, 37.55B active, MLA, experts."""
    done = run_plan("--model", "deepseek-v3", "--cluster", "4x8xH200", *extra)
    header = done.stdout.splitlines()[0]
    for words in ("671.03B params", "37.55B active", "61 layers", "MLA 128 heads", "256 experts top-8",
                  "+ 1 shared in 58 layers", "KV 69 KiB/token (bfloat16)"):
        assert words in header, (words, header)
