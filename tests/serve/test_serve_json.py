"""`plan --json` for serving: the keys the README documents, in SI units."""

from __future__ import annotations

import json

import pytest

TOP_LEVEL = {"workload", "model", "model_summary", "cluster", "recommended", "layouts", "rejected"}
LAYOUT = {
    "tp",
    "pp",
    "dp",
    "rank",
    "memory_per_gpu_bytes",
    "capacity_per_gpu_bytes",
    "memory",
    "kv_cache_tokens",
    "max_concurrency",
    "tp_allreduce_seconds_per_layer",
    "tp_link",
    "pp_link",
    "bubble_fraction",
    "ttft_seconds",
    "tpot_seconds",
    "throughput_tokens_per_second",
    "command",
}
MEMORY = {"weights_bytes", "kv_cache_bytes", "activation_bytes", "overhead_bytes"}


@pytest.fixture(scope="module")
def headline(plan_json) -> tuple[int, dict]:
    return plan_json("--model", "llama-3.1-70b", "--cluster", "2x8xA100")


def test_top_level_keys(headline):
    code, out = headline
    assert code == 0
    assert TOP_LEVEL <= out.keys()
    assert out["workload"] == "serve"
    assert out["model"] == "llama-3.1-70b" and out["cluster"] == "2x8xA100"
    assert out["recommended"] == out["layouts"][0]


def test_every_layout_object_has_the_promised_keys(headline):
    _, out = headline
    assert out["layouts"]
    for rank, layout in enumerate(out["layouts"], start=1):
        assert LAYOUT <= layout.keys(), LAYOUT - layout.keys()
        assert MEMORY <= layout["memory"].keys()
        assert layout["rank"] == rank
        assert layout["tp"] * layout["pp"] * layout["dp"] == 16
        assert 0 < layout["memory_per_gpu_bytes"] <= layout["capacity_per_gpu_bytes"]
        assert layout["capacity_per_gpu_bytes"] == 80 * 2**30
        assert sum(layout["memory"].values()) == pytest.approx(layout["memory_per_gpu_bytes"])
        assert layout["tp_link"] in (None, "nvlink", "infiniband")
        assert (layout["tp_link"] is None) == (layout["tp"] == 1)
        assert (layout["pp_link"] is None) == (layout["pp"] == 1)
        assert 0 <= layout["bubble_fraction"] < 1
        assert layout["ttft_seconds"] > 0 and layout["tpot_seconds"] > 0
        assert layout["throughput_tokens_per_second"] > 0
        assert layout["kv_cache_tokens"] >= 131072
        assert layout["max_concurrency"] == pytest.approx(layout["kv_cache_tokens"] / 131072)
        command = layout["command"]
        assert command and all(
            isinstance(step["argv"], list) and step["argv"] and all(isinstance(arg, str) for arg in step["argv"])
            for step in command
        )
        assert any(step["argv"][:3] == ["vllm", "serve", "MODEL"] for step in command)
        assert all(step["nodes"]["count"] >= 1 and step["role"] for step in command)


def test_ranked_best_first_by_throughput(headline):
    _, out = headline
    rates = [layout["throughput_tokens_per_second"] for layout in out["layouts"]]
    assert rates == sorted(rates, reverse=True)


def test_rejected_entries_have_degrees_and_reasons(headline):
    _, out = headline
    assert out["rejected"]
    for item in out["rejected"]:
        assert {"tp", "pp", "dp", "reasons"} <= item.keys()
        assert item["reasons"] and all(isinstance(r, str) and r for r in item["reasons"])
        # what orders the text's closest misses: a memory overshoot in bytes, an SLA miss ratio, or neither
        assert item["over_bytes"] is None or item["over_bytes"] > 0
        assert item["sla_miss_ratio"] is None or item["sla_miss_ratio"] > 1
    total = len(out["layouts"]) + len(out["rejected"])
    assert total == 15  # every ordered factorization of 16 GPUs


def test_infeasible_json_has_null_recommendation_and_exit_1(plan_json):
    code, out = plan_json("--model", "llama-3.1-70b", "--cluster", "1x1xH100")
    assert code == 1
    assert out["recommended"] is None and out["layouts"] == []
    (rejected,) = out["rejected"]
    assert (rejected["tp"], rejected["pp"], rejected["dp"]) == (1, 1, 1)
    assert "weights exceed memory" in rejected["reasons"][0]
    assert any("int4" in s for s in out["suggestions"])


def test_moe_layouts_say_where_the_expert_rate_comes_from():
    """`moe_kernel_source`: "measured" where the catalog has the GPU's fused-MoE kernel for the
    experts' format (Qwen3-30B-A3B bf16 on H100), "model" where the dense rates stand in (A100),
    null for a dense model; each decode step carries its `moe_seconds`."""
    from typer.testing import CliRunner

    from planner.cli import app

    def first(model: str, cluster: str) -> dict:
        result = CliRunner().invoke(app, ["--model", model, "--cluster", cluster, "--json", "--top", "1"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["layouts"][0]

    measured = first("qwen3-30b-a3b", "1x8xH100")
    assert measured["moe_kernel_source"] == "measured" and measured["decode_steps"][0]["moe_seconds"] > 0
    assert first("qwen3-30b-a3b", "1x8xA100")["moe_kernel_source"] == "model"
    dense = first("llama-3.1-8b", "1x8xH100")
    assert dense["moe_kernel_source"] is None and dense["decode_steps"][0]["moe_seconds"] == 0


def test_every_layout_row_has_the_metrics_keys_only_the_first_filled():
    """`metrics` and its companions are on every row (null past the first), so code reading
    layouts[].metrics needs no guard (a CLI read found them on the first row only)."""
    from typer.testing import CliRunner

    from planner.cli import app

    out = json.loads(CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--json",
                                              "--mode", "aggregated", "--top", "3"]).output)
    first, *rest = out["layouts"]
    assert rest and first["metrics"] is not None and first["metrics_source"] == "steady state"
    keys = ("metrics", "metrics_source", "metrics_sla_misses", "metrics_sla")
    assert all(row[key] is None for row in rest for key in keys)
