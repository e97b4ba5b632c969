"""Where an MoE model's dense layers sit (ModelSpec.dense_layer_indices) and what each pipeline
stage then holds and runs: DeepSeek-V3's three dense layers are all on stage 0, so its later
stages are all MoE and weigh more than the mean block says."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.cost.moe import moe_layers_of
from planner.cost.params import (
    bytes_per_weight,
    moe_layer_excess_active_params,
    moe_layer_excess_bytes_per_gpu,
)
from planner.cost.serving_memory import stage_layer_counts, stage_memory, stage_moe_layer_counts
from planner.cost.serving_time import stage_dense_layer_equivalents, stage_matmul_flops_per_token
from planner.cost.stage_split import stage_layer_indices
from planner.cost.training_memory import placed_moe_layer_excess, stage_params_per_gpu
from planner.emit.megatron import moe_layer_freq_pattern
from planner.errors import SpecError
from planner.hf_config import load_hf_config
from planner.layout import Layout
from planner.requests import ServeRequest
from planner.specs import load_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs"
DSV3 = resolve_model("deepseek-v3")
MEAN_DSV3 = DSV3.model_copy(update={"dense_layer_indices": None})


def test_config_json_patterns_become_indices():
    """DeepSeek-V3's first_k_dense_replace 3 -> layers 0-2; Llama 4 Maverick's
    interleave_moe_layer_step 2 -> MoE where (i + 1) % 2 == 0, dense at the even layers;
    Nemotron-H's Mamba/attention/MLP blocks interleave and stay the mean block (None)."""
    deepseek = load_hf_config(FIXTURES / "deepseek-ai--DeepSeek-V3" / "config.json")
    assert deepseek.dense_layer_indices == [0, 1, 2] and deepseek.num_dense_layers == 3
    maverick = load_hf_config(FIXTURES / "meta-llama--Llama-4-Maverick-17B-128E-Instruct" / "config.json")
    assert maverick.dense_layer_indices == list(range(0, 48, 2))
    nemotron = load_hf_config(FIXTURES / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16" / "config.json")
    assert nemotron.num_dense_layers == 29 and nemotron.dense_layer_indices is None
    assert DSV3.dense_layer_indices == [0, 1, 2]  # the shipped spec


@pytest.mark.parametrize(("extra", "message"), [
    ("dense_layer_indices: [0, 1]", "dense_layer_indices: 2 layers listed, but num_dense_layers is 3"),
    ("dense_layer_indices: [0, 2, 1]", "dense_layer_indices: must be ascending, each layer once"),
    ("dense_layer_indices: [0, 1, 1]", "dense_layer_indices: must be ascending, each layer once"),
    ("dense_layer_indices: [0, 1, 61]", "dense_layer_indices: layer 61 is past the last"),
])
def test_bad_indices_name_the_field(tmp_path, extra, message):
    text = (Path(__file__).resolve().parents[2] / "planner" / "model_specs" / "deepseek-v3.yaml").read_text()
    text = "\n".join(line for line in text.splitlines() if not line.startswith("dense_layer_indices"))
    path = tmp_path / "bad.yaml"
    path.write_text(text + "\n" + extra + "\n")
    with pytest.raises(SpecError, match=message):
        load_model(path)


def test_stage_moe_layers_by_hand():
    """61 layers over 4 stages: vLLM's get_pp_indices gives 15 each and the one left over to
    the stage before the last: 15, 15, 16, 15. Layers 0-2 dense: 12, 15, 16, 15 MoE layers;
    the mean share would be 15 * 58/61 = 14.262 and 16 * 58/61 = 15.213."""
    counts = stage_layer_counts(61, 4)
    assert counts == [15, 15, 16, 15]
    assert stage_moe_layer_counts(DSV3, counts) == [12, 15, 16, 15]
    assert stage_moe_layer_counts(MEAN_DSV3, counts) == pytest.approx([14.262, 14.262, 15.213, 14.262], abs=1e-3)


def test_moe_layer_excess_bytes_by_hand():
    """At t = 8 (no EP): 256 experts * 3 * 7168 * 2048 / 8 = 1,409,286,144 weights, the shared
    expert 3 * 7168 * 2048 / 8 = 5,505,024, less the dense MLP 3 * 7168 * 18432 / 8 =
    49,545,216: 1,365,245,952 fp8 weights at 1 + 4/7168 B; the router 7168 * 256 bf16
    = 3,670,016 B."""
    fp8 = 1 + 4 / 7168
    assert bytes_per_weight(DSV3, "fp8") == pytest.approx(fp8)
    weights = 256 * 3 * 7168 * 2048 // 8 + 3 * 7168 * 2048 // 8 - 3 * 7168 * 18432 // 8
    assert weights == 1_365_245_952
    expected = weights * fp8 + 7168 * 256 * 2
    assert moe_layer_excess_bytes_per_gpu(DSV3, 8) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(1_369_677_824, rel=1e-9)
    # with ep = 8 a GPU keeps 32 whole experts: the same routed bytes as 1/8 of each
    assert moe_layer_excess_bytes_per_gpu(DSV3, 8, 8) == pytest.approx(expected, rel=1e-12)
    assert moe_layer_excess_bytes_per_gpu(resolve_model("llama-3.1-8b"), 8) == 0.0


def test_stages_hold_their_own_layers_and_the_total_is_unchanged():
    """tp=8 pp=4 ep=8 on 4x8 H200: stage 1 (layers 15-29, all MoE) holds 15 - 14.262 = 0.738
    MoE layers more than the mean share, each 1,369,677,824 B beyond a dense one: +1.01 GB;
    stage 0 (12 MoE of 15) 2.262 fewer: -3.10 GB. Over all stages the weights are the mean
    block's (the excesses sum to 0), so the model's total is unchanged."""
    cluster = resolve_cluster("4x8xH200")
    layout = Layout(8, 4, 1, 8)
    request = ServeRequest(max_model_len=8192)
    placed = stage_memory(DSV3, cluster, layout, request, 256)
    mean = stage_memory(MEAN_DSV3, cluster, layout, request, 256)
    excess = moe_layer_excess_bytes_per_gpu(DSV3, 8, 8)
    delta = [p.weights_bytes - m.weights_bytes for p, m in zip(placed, mean, strict=True)]
    assert delta[1] == pytest.approx((15 - 15 * 58 / 61) * excess, rel=1e-9)
    assert delta[1] == pytest.approx(1.0104e9, rel=1e-3)
    assert delta[0] == pytest.approx((12 - 15 * 58 / 61) * excess, rel=1e-9)
    assert sum(delta) == pytest.approx(0.0, abs=1.0)
    # the heavier stage keeps less KV
    assert placed[1].kv_cache_tokens < mean[1].kv_cache_tokens
    assert [s.num_moe_layers for s in placed] == [12, 15, 16, 15]


def test_stage_compute_by_hand():
    """Stage 1 of 4 (15 MoE layers) against the mean share (14.262): the non-routed matmul work
    in mean blocks is 15 + Delta * x / a, Delta = 15 - 15 * 58/61 = 0.7377, x = shared 3 * 7168 *
    2048 + router 7168 * 256 - dense 3 * 7168 * 18432 = -350,486,528, a = the mean block's
    non-routed active parameters: attention 187,107,328 + norms 14,336 + (58 * 45,875,200 + 3 *
    396,361,728) / 61 = 250,233,906.36; 15 - 1.0333 = 13.9667 mean blocks. The routed
    experts go up by Delta * 8 experts * 44,040,192, so a token's matmul FLOPs on the stage
    are 2 * (15 * mean active + Delta * (x + 8 * 44,040,192))."""
    cluster = resolve_cluster("4x8xH200")
    layout = Layout(8, 4, 1, 8)
    (_, stage1, _, _) = stage_memory(DSV3, cluster, layout, ServeRequest(max_model_len=8192), 256)
    delta = 15 - 15 * 58 / 61
    x = 3 * 7168 * 2048 + 7168 * 256 - 3 * 7168 * 18432
    assert moe_layer_excess_active_params(DSV3) == x == -350_486_528
    a = 187_107_328 + 14_336 + (58 * 45_875_200 + 3 * 396_361_728) / 61
    assert stage_dense_layer_equivalents(DSV3, stage1) == pytest.approx(15 + delta * x / a, rel=1e-12)
    assert stage_dense_layer_equivalents(DSV3, stage1) == pytest.approx(13.9667, abs=1e-4)
    mean_active = 585_228_153.704918
    flops = stage_matmul_flops_per_token(DSV3, stage1, 4)
    assert flops == pytest.approx(2 * (15 * mean_active + delta * (x + 8 * 44_040_192)), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 8), dense=st.sets(st.integers(0, 60), min_size=1, max_size=20))
def test_any_placement_keeps_the_totals(pp, dense):
    """Wherever the dense layers sit, the stages' MoE layers sum to the model's and the
    weights over all stages equal the mean block's."""
    indices = sorted(dense)
    model = DSV3.model_copy(update={"num_dense_layers": len(indices), "dense_layer_indices": indices})
    counts = stage_layer_counts(61, pp)
    moe = stage_moe_layer_counts(model, counts)
    assert sum(moe) == model.num_moe_layers
    assert all(0 <= m <= n for m, n in zip(moe, counts, strict=True))
    excess = [m - moe_layers_of(model, n) for m, n in zip(moe, counts, strict=True)]
    assert sum(excess) == pytest.approx(0.0, abs=1e-9)


def test_megatron_layer_pattern():
    """--moe-layer-freq, evaluated as Megatron's _eval_pattern does (core_v0.19.0), lists
    one flag per layer: 0 dense, 1 MoE."""
    assert moe_layer_freq_pattern(DSV3) == "([0]*3+[1]*58)"
    maverick = load_hf_config(FIXTURES / "meta-llama--Llama-4-Maverick-17B-128E-Instruct" / "config.json")
    pattern = moe_layer_freq_pattern(maverick)
    assert pattern == "([0]+[1])*24"
    assert eval(pattern) == [0, 1] * 24  # noqa: S307 - digits, brackets, + and * only
    odd = DSV3.model_copy(update={"num_dense_layers": 2, "dense_layer_indices": [0, 60]})
    assert eval(moe_layer_freq_pattern(odd)) == [0] + [1] * 59 + [0]  # noqa: S307


def test_training_stages_build_megatrons_chunks():
    """Chunk j of stage i is the (j*p + i)-th run of layers: 2 stages of 3 layers at v = 2 have
    chunks of 2|2|1|1 layers in that order, so stage 0 builds 0, 1, 4 and stage 1 2, 3, 5."""
    assert stage_layer_indices((3, 3), 2) == [[0, 1, 4], [2, 3, 5]]
    assert stage_layer_indices((2, 3, 2), 1) == [[0, 1], [2, 3, 4], [5, 6]]


@given(layers=st.lists(st.integers(1, 12), min_size=1, max_size=8), v=st.integers(1, 4))
def test_training_stages_partition_the_layers(layers, v):
    stages = stage_layer_indices(tuple(layers), v)
    assert [len(s) for s in stages] == layers
    assert sorted(i for s in stages for i in s) == list(range(sum(layers)))


def test_training_stage_params_by_hand():
    """DeepSeek-V3 on 4 stages of 16, 15, 15, 15 (v = 1), dense layers 0-2: stage 0 holds 13
    MoE layers against a mean share of 16 * 58/61 = 15.213 (-2.213), the others 15 against
    14.262 (+0.738). At t = 8 without EP each MoE layer holds, beyond a dense one, the router
    7168 * 256 = 1,835,008 + experts 256 * 3 * 7168 * 2048 / 8 = 1,409,286,144 + (shared
    3 * 7168 * 2048 - dense 3 * 7168 * 18432) / 8 = -44,040,192 parameters: 1,367,080,960.
    With v = 2 the first stage's first chunk (8 layers) still holds all three dense layers."""
    delta = placed_moe_layer_excess(DSV3, 4, (16, 15, 15))
    assert delta == pytest.approx((13 - 16 * 58 / 61, 15 - 15 * 58 / 61, 15 - 15 * 58 / 61))
    assert delta == pytest.approx((-2.213, 0.738, 0.738), abs=1e-3)
    assert placed_moe_layer_excess(DSV3, 4, (16, 15, 15), 2) == delta
    excess = 7168 * 256 + 256 * 3 * 7168 * 2048 / 8 + (3 * 7168 * 2048 - 3 * 7168 * 18432) / 8
    assert excess == 1_367_080_960
    placed = stage_params_per_gpu(DSV3, 8, 4, (16, 15, 15), 1)
    mean = stage_params_per_gpu(MEAN_DSV3, 8, 4, (16, 15, 15), 1)
    assert placed.first_stage - mean.first_stage == pytest.approx(delta[0] * excess, rel=1e-9)
    assert placed.middle_stage - mean.middle_stage == pytest.approx(delta[1] * excess, rel=1e-9)
    assert placed.last_stage - mean.last_stage == pytest.approx(delta[2] * excess, rel=1e-9)
    routed = 256 * 3 * 7168 * 2048 / 8
    assert (placed.routed_experts.middle_stage - mean.routed_experts.middle_stage
            == pytest.approx(delta[1] * routed, rel=1e-9))
    # ends-only triples and one stage are the mean block's
    assert placed_moe_layer_excess(DSV3, 4, (0, 0, 0)) == (0.0, 0.0, 0.0)
    assert placed_moe_layer_excess(DSV3, 1, (61, 0, 61)) == (0.0, 0.0, 0.0)


def test_explain_says_each_stages_moe_layers():
    """plan explain's memory bars say where the dense layers went: DeepSeek-V3 tp=8 pp=2 puts
    layers 0-30 (three dense) on stage 0 and 31-60 on stage 1 (vLLM's get_pp_indices: 30 each,
    the extra one on stage 0, the stage before the last)."""
    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(app, ["explain", "--model", "deepseek-v3", "--cluster", "2x8xH200", "--layout",
                                      "tp=8,pp=2", "--input-len", "1024", "--output-len", "256", "--no-sensitivity"])
    assert result.exit_code == 0, result.output
    assert "31 layers, 28 of them MoE" in result.output and "30 layers, 30 of them MoE" in result.output


def test_the_heaviest_middle_stage_follows_the_sign_of_the_excess():
    """At t = 2, ep = 256 a GPU keeps one expert per MoE layer: an MoE layer holds 7168 * 256
    (router) + 3 * 7168 * 2048 (one expert) + (3 * 7168 * 2048 - 3 * 7168 * 18432) / 2 =
    -130,285,568 parameters beyond a dense one, so the middle stage that holds dense layers is
    the heavy one. Dense layers 20-22 on 4 stages of 16 | 15 | 15 | 15: stage 1 (layers 16-30)
    holds 12 MoE layers against a mean share of 14.26, stage 2 all 15 (+0.74); the middle priced
    is stage 1 (-2.26 layers, +294M parameters), where the most-MoE rule took stage 2."""
    model = DSV3.model_copy(update={"dense_layer_indices": [20, 21, 22]})
    mean = MEAN_DSV3
    x = 7168 * 256 + 3 * 7168 * 2048 + (3 * 7168 * 2048 - 3 * 7168 * 18432) / 2
    assert x == -130_285_568
    first, middle, last = placed_moe_layer_excess(model, 4, (16, 15, 15), 1, x)
    assert middle == pytest.approx(12 - 15 * 58 / 61)
    assert placed_moe_layer_excess(model, 4, (16, 15, 15), 1, -x)[1] == pytest.approx(15 - 15 * 58 / 61)
    placed = stage_params_per_gpu(model, 2, 4, (16, 15, 15), 256)
    unplaced = stage_params_per_gpu(mean, 2, 4, (16, 15, 15), 256)
    assert placed.middle_stage - unplaced.middle_stage == pytest.approx(middle * x, rel=1e-9)
    assert middle * x == pytest.approx(294.5e6, rel=1e-3)
