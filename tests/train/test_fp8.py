"""FP8 training (--precision fp8, Transformer Engine): hand-worked layer time and memory,
the A100 refusal, and fp8 never slower than bf16 (docs/cost-model.md#training-fp8)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost import activations as act
from planner.cost.training_memory import fp8_weight_cache_bytes
from planner.cost.training_time import TrainRates, layer_seconds, logits_seconds
from planner.layout import Rejected, TrainConfig
from planner.requests import TrainRequest
from planner.specs import ModelSpec, SpecError
from planner.train import estimate

# The GPT block of tests/train/test_formulas.py: h = 64, a = 4 (d = 16), f = 4h = 256.
TINY = ModelSpec(name="tiny", num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                 intermediate_size=256, gated_mlp=False, vocab_size=1000,
                 max_position_embeddings=128, tie_word_embeddings=True, dtype="float16")
S, B_MICRO, TP = 128, 2, 4  # b*s = 256 tokens
RATES = TrainRates(peak_flops_per_s=100e12, matmul_flops_per_s=87e12, elementwise_bytes_per_s=1.6e12,
                   fp8_matmul_flops_per_s=174e12)


def test_fp8_layer_time_by_hand():
    """TINY at t = 4, flash, no recompute. The four linear GEMMs (tokens x out x in, 2*M*N*K
    FLOP, u = prod x/(x + 128)):
      QKV  256 x 48 x 64: 1,572,864 FLOP, u = 2/3 * 3/11 * 1/3 = 2/33 -> 25,952,256 effective
      proj 256 x 64 x 16:   524,288 FLOP, u = 2/3 * 1/3 * 1/9  = 2/81 -> 21,233,664
      up   256 x 64 x 64: 2,097,152 FLOP, u = 2/3 * 1/3 * 1/3  = 2/27 -> 28,311,552
      down 256 x 64 x 64: the same                                   -> 28,311,552
    Sum 103,809,024 effective FLOP: forward at 87e12 (bf16) 1.19321 us, at 174e12 (fp8)
    0.59660 us; the backward (dgrad + wgrad) is twice that in both. Flash core, elementwise
    traffic and the LM head are the same at both precisions; fp8 adds TE's unfused casts
    (fp8_cast_bytes_per_layer, tests/train/test_fp8_kernels.py): forward 147,456 B, backward
    245,760 B at 1.6e12 B/s = 0.09216 / 0.15360 us. So fp8 saves
    103,809,024 * (1/87e12 - 1/174e12) - casts = 0.59660 - 0.09216 us forward and
    1.19321 - 0.15360 us backward."""
    bf16 = layer_seconds(TINY, S, B_MICRO, TP, False, "none", RATES, "flash", "bf16")
    fp8 = layer_seconds(TINY, S, B_MICRO, TP, False, "none", RATES, "flash", "fp8")
    saved = 103_809_024 * (1 / 87e12 - 1 / 174e12)
    cast_forward, cast_backward = 147_456 / 1.6e12, 245_760 / 1.6e12
    assert bf16.forward - fp8.forward == pytest.approx(saved - cast_forward, rel=1e-9)
    assert bf16.backward - fp8.backward == pytest.approx(2 * saved - cast_backward, rel=1e-9)
    assert fp8.recompute == bf16.recompute == 0.0
    # materialized attention: its per-head GEMMs stay at the bf16 rate, same saving
    bf16_m = layer_seconds(TINY, S, B_MICRO, TP, False, "none", RATES, "materialized", "bf16")
    fp8_m = layer_seconds(TINY, S, B_MICRO, TP, False, "none", RATES, "materialized", "fp8")
    assert bf16_m.forward - fp8_m.forward == pytest.approx(saved - cast_forward, rel=1e-9)


def test_fp8_activations_by_hand():
    """fp8 saves (2 - 1) bytes on each linear input per token: QKV and MLP-up inputs 2h (/t
    with SP), output-projection input a*d/t, MLP-down input f/t. t = 4, flash, no recompute:
    TP only 128 + 16 + 64 = 208 B/token * 256 = 53,248: 263,168 -> 209,920; TP + SP
    32 + 16 + 64 = 112 * 256 = 28,672: 140,288 -> 111,616. Full recompute keeps the 16-bit
    layer input (8,192 with SP) at both precisions."""
    assert act.activation_bytes_per_layer(TINY, S, B_MICRO, TP, False, "none", "flash", "fp8") == 209_920
    assert act.activation_bytes_per_layer(TINY, S, B_MICRO, TP, True, "none", "flash", "fp8") == 111_616
    assert act.activation_bytes_per_layer(TINY, S, B_MICRO, TP, True, "full", "flash", "fp8") == 8_192


def test_fp8_weight_cache_by_hand():
    """TINY's linear weights per block 4h^2 + 2hf = 16,384 + 32,768 = 49,152, /t = 12,288 per
    GPU, 2 bytes each (fp8 copy + transpose) = 24,576; plus 4 GEMMs * 5 fp8 tensors * 4 B *
    (1024 history + scale + inverse) = 4 * 20,520 = 82,080. Per layer 106,656; 4 layers
    426,624; ZeRO-3 over d = 2 halves it."""
    assert fp8_weight_cache_bytes(TINY, TP, 1, 1, 0) == 106_656
    assert fp8_weight_cache_bytes(TINY, TP, 4, 2, 1) == 426_624
    assert fp8_weight_cache_bytes(TINY, TP, 4, 2, 3) == 213_312


def test_lm_head_stays_bf16():
    """The output layer is not a TE module (Megatron core_v0.19.0): same time at both precisions."""
    assert logits_seconds(TINY, S, B_MICRO, TP, RATES) == logits_seconds(
        TINY, S, B_MICRO, TP, TrainRates(100e12, 87e12, 1.6e12))


LLAMA8B = resolve_model("llama-3.1-8b")
H100 = resolve_cluster("1x8xH100")
REQUEST = TrainRequest(global_batch=64, seq_len=4096)


def _pair(config: TrainConfig, request: TrainRequest = REQUEST, cluster=H100):
    bf16 = estimate(LLAMA8B, cluster, config, request)
    fp8 = estimate(LLAMA8B, cluster, config, TrainRequest(global_batch=request.global_batch,
                                                          seq_len=request.seq_len, precision="fp8"))
    return bf16, fp8


def test_fp8_memory_vs_bf16_one_config():
    """Llama 3.1 8B, tp = 2, pp = 1, dp = 4, b = 1, SP, no recompute, 1F1B, s = 4096: the fp8
    weights add 32 layers of fp8_weight_cache_bytes (218.1M linear weights per block / 2 * 2 B
    + 4 * 20,520 B: 218.2 MB per layer, 6.98 GB); activations shrink by 32 layers of
    (2h/t + a*d/t + f/t) = 4,096 + 2,048 + 7,168 = 13,312 B/token * 4,096 tokens = 54.5 MB
    per layer (1.74 GB); gradients and optimizer are unchanged; the estimate says fp8."""
    config = TrainConfig(2, 1, 4, 1, "1f1b", 1, "none", True, 1)
    bf16, fp8 = _pair(config)
    assert fp8.config.precision == "fp8" and bf16.config.precision == "bf16"
    cache = fp8_weight_cache_bytes(LLAMA8B, 2, 32, 4, 1)
    assert cache == pytest.approx(32 * (218_103_808 + 82_080), rel=1e-12)
    assert fp8.memory.weights_bytes - bf16.memory.weights_bytes == pytest.approx(cache, rel=1e-12)
    assert bf16.memory.activation_bytes - fp8.memory.activation_bytes == pytest.approx(
        32 * 13_312 * 4096, rel=1e-12)
    assert (fp8.memory.gradient_bytes, fp8.memory.optimizer_bytes) == (
        bf16.memory.gradient_bytes, bf16.memory.optimizer_bytes)
    assert fp8.step_time_seconds < bf16.step_time_seconds


def test_fp8_refused_on_a100():
    """A100 has no fp8 tensor cores: a spec error naming --precision and the GPU."""
    config = TrainConfig(2, 1, 4, 1, "1f1b", 1, "none", True, 1)
    with pytest.raises(SpecError, match=r"--precision fp8: A100.*no fp8"):
        _pair(config, cluster=resolve_cluster("1x8xA100"))


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), b=st.sampled_from([1, 2, 4]), s=st.sampled_from([1024, 2048, 8192]),
       sp=st.booleans(), recompute=st.sampled_from(["none", "selective", "full"]),
       attention=st.sampled_from(["flash", "materialized"]))
def test_fp8_never_slower_than_bf16_on_h100(tp, b, s, sp, recompute, attention):
    """Same configuration, same request but the precision: the fp8 step is never longer."""
    sp = sp and tp > 1
    dp = 8 // tp
    request = TrainRequest(global_batch=8 * dp, seq_len=s, attention=attention)
    config = TrainConfig(tp, 1, dp, b, "1f1b", 1, recompute, sp, 1, attention=attention)
    bf16 = estimate(LLAMA8B, H100, config, request)
    fp8 = estimate(LLAMA8B, H100, config, TrainRequest(global_batch=8 * dp, seq_len=s, attention=attention,
                                                       precision="fp8"))
    if isinstance(bf16, Rejected) or isinstance(fp8, Rejected):
        return  # out of memory: there is no step time to compare
    assert fp8.step_time_seconds <= bf16.step_time_seconds


@pytest.mark.parametrize(("gpu", "bf16_tflops", "fp8_tflops"), [
    # MI300X: bf16 measured 668 of 1,307 (0.5111); fp8 unmeasured: 0.5111 x 2,615 = 1,336.5, 2.0x bf16
    ("MI300X", 668, 668 / 1307 * 2615),
    # GB200: bf16 measured 1,822 of 2,500 (0.7288); fp8 0.7288 x 5,000 = 3,644 (the default gave 3,750)
    ("GB200", 1822, 1822 / 2500 * 5000),
    # A100-class bf16 share 0.87 is above the default: an unmeasured precision stays at 0.75 of its peak;
    # H100 has both measured (794, 1,403): nothing derived
    ("H100", 794, 1403),
])
def test_unmeasured_fp8_runs_at_the_gpus_own_bf16_share(gpu: str, bf16_tflops: float, fp8_tflops: float):
    """Where the catalog measured bf16 but not fp8, fp8 GEMMs run at the GPU's measured bf16 share
    of peak (capped at the 0.75 default), not at 0.75 of the fp8 peak: MI300X's fp8 layer was
    2.25x faster than bf16 with peaks 2x apart (efficiency.unmeasured_fraction_of_peak). A
    training step runs both at TRAIN_SUSTAINED_RATE_FRACTION (0.93) of them."""
    from planner.train import train_rates

    rates = train_rates(resolve_model("llama-3.1-8b"), resolve_cluster(f"1x8x{gpu}"))
    assert rates.matmul_flops_per_s == pytest.approx(0.93 * bf16_tflops * 1e12)
    assert rates.fp8_matmul_flops_per_s == pytest.approx(0.93 * fp8_tflops * 1e12)
    assert rates.fp8_matmul_flops_per_s / rates.matmul_flops_per_s <= 2.001  # the fp8 peaks are 2.0008x bf16


def test_fp8_layer_is_at_most_twice_as_fast_as_bf16_on_mi300x():
    """The same layout in both precisions on MI300X (fp8 peak 2x bf16's, fp8 unmeasured): the step
    is faster in fp8 but by less than 2x, since attention and elementwise work stay 16-bit."""
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xMI300X")
    steps = []
    for precision in ("bf16", "fp8"):
        config = TrainConfig(1, 1, 8, 2, "1f1b", 1, "none", False, 3)
        result = estimate(model, cluster, config, TrainRequest(global_batch=64, seq_len=4096, precision=precision))
        assert not isinstance(result, Rejected)
        steps.append(result.step_time_seconds)
    assert 1.0 < steps[0] / steps[1] < 2.0


def test_fp8_slower_than_bf16_says_so():
    """Qwen3-30B-A3B on 8 H100 at 64 sequences of 4,096 tokens: fp8's weight cache leaves
    micro-batch 1 (8 micro-batches), whose MoE blocks wait on the host each forward, so its plan
    runs fewer tokens/s than bf16's at micro-batch 2. The plan names the bf16 configuration, by
    how much it is faster and the term fp8 spends more on; where fp8 is faster (Llama-3.1-8B)
    there is nothing to say."""
    from typer.testing import CliRunner

    from planner.cli import app
    from planner.train_search import search

    model, cluster = resolve_model("qwen3-30b-a3b"), resolve_cluster("1x8xH100")
    fp8 = search(model, cluster, TrainRequest(global_batch=64, seq_len=4096, precision="fp8"), keep_top=1)
    bf16 = search(model, cluster, TrainRequest(global_batch=64, seq_len=4096), keep_top=1)
    assert fp8.bf16_faster is not None
    assert fp8.bf16_faster.tokens_per_second == pytest.approx(bf16.recommended.tokens_per_second)
    assert fp8.bf16_faster.tokens_per_second > fp8.recommended.tokens_per_second
    out = CliRunner().invoke(app, ["--workload", "train", "--model", "qwen3-30b-a3b", "--cluster", "1x8xH100",
                                   "--global-batch", "64", "--seq-len", "4096", "--precision", "fp8"])
    text = " ".join(out.output.split())
    assert out.exit_code == 0 and "fp8 is slower here: bf16 runs" in text and "host waits (MoE syncs)" in text
    dense = search(resolve_model("llama-3.1-8b"), cluster, TrainRequest(global_batch=64, seq_len=4096, precision="fp8"),
                   keep_top=1)
    assert dense.bf16_faster is None


def test_the_table_says_the_fp8_mfu_is_over_the_bf16_peak():
    """MFU is model FLOPs over the bf16 dense peak at every precision; an fp8 table's column
    says so (the summary line already did)."""
    from typer.testing import CliRunner

    from planner.cli import app

    args = ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "64",
            "--seq-len", "4096", "--top", "2"]
    fp8 = CliRunner().invoke(app, [*args, "--precision", "fp8"], env={"COLUMNS": "250"})
    bf16 = CliRunner().invoke(app, args, env={"COLUMNS": "250"})
    assert fp8.exit_code == 0 and bf16.exit_code == 0
    assert "MFU (bf16 peak)" in fp8.output and "MFU (bf16 peak)" not in bf16.output and "MFU" in bf16.output
