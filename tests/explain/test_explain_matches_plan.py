"""`plan explain` reads the estimate; it never recomputes a number of the plan. So every
number it shows for the recommended layout equals the one `plan --json` gives for it:
metrics, the time breakdown's parts, every collective's time, size and count, and every
memory segment of every stage shown."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app

SERVE_CASES = [
    ["--model", "llama-3.1-70b", "--cluster", "2x8xA100"],  # tp and pp, 2 batches in flight
    ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--objective", "latency"],
    ["--model", "llama-3.1-405b", "--cluster", "2x8xH100", "--max-model-len", "8192"],
]
TRAIN_CASES = [
    ["--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--global-batch", "256",
     "--seq-len", "4096", "--layout", "tp=2,pp=2", "--schedule", "1f1b"],
    ["--workload", "train", "--model", "gpt3-175b", "--cluster", "16x8xA100", "--global-batch", "1536",
     "--seq-len", "2048"],
]


def _json(args: list[str]) -> dict:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _both(args: list[str]) -> tuple[dict, dict]:
    plan = _json([*args, "--json", "--emit", "none"] if "train" in args else [*args, "--json"])
    explained = _json(["explain", *args, "--json", "--no-sensitivity"])
    return plan["recommended"], explained


def _segments(section: dict) -> dict[str, float]:
    return {s["name"]: s.get("seconds", s.get("bytes")) for s in section["segments"]}


@pytest.mark.parametrize("args", SERVE_CASES, ids=lambda a: " ".join(a[1:4]))
def test_serving_explain_shows_the_plans_numbers(args: list[str]) -> None:
    rec, e = _both(args)
    assert (e["layout"]["tp"], e["layout"]["pp"], e["layout"]["dp"]) == (rec["tp"], rec["pp"], rec["dp"])
    metrics = {m["name"]: m["value"] for m in e["metrics"]}
    assert metrics["TPOT"] == rec["tpot_seconds"]
    assert metrics["TTFT"] == rec["ttft_seconds"]
    assert metrics["throughput"] == rec["throughput_tokens_per_second"]
    assert metrics["concurrent sequences per replica"] == rec["batch"]
    assert metrics["batches in flight"] == rec["batches_in_flight"]
    assert metrics["bubble"] == rec["bubble_fraction"]

    k = rec["batches_in_flight"]
    step = rec["decode_steps"][rec["slowest_stage"]]
    layers = rec["stages"][rec["slowest_stage"]]["num_layers"]
    parts = _segments(e["breakdown"])
    assert e["breakdown"]["total_seconds"] == rec["tpot_seconds"]
    bound = "memory-bound work" if rec["decode_bound"] == "memory" else "compute"
    assert parts[bound] == k * step["compute_or_memory_seconds"]
    assert parts["per-layer launch overhead"] == k * step["overhead_seconds"]
    assert parts["TP comm"] == k * layers * step["allreduce_seconds_per_layer"]

    assert len(e["collectives"]) == len(rec["collectives"])
    for shown, priced in zip(e["collectives"], rec["collectives"], strict=True):
        assert (shown["phase"], shown["name"], shown["kind"]) == (priced["phase"], priced["name"], priced["kind"])
        assert shown["total_seconds"] == priced["seconds"]
        assert shown["message_bytes"] == priced["message_bytes"]
        assert shown["count_per_step"] == priced["count_per_step"]

    for bar in e["memory"]:
        for stage in bar["stages"]:
            priced = rec["stages"][stage]
            assert _segments(bar) == {"weights": priced["weights_bytes"], "activations": priced["activation_bytes"],
                                      "overhead": priced["overhead_bytes"], "KV cache": priced["kv_cache_bytes"]}
            assert bar["budget_bytes"] == priced["budget_bytes"]


@pytest.mark.parametrize("args", TRAIN_CASES, ids=lambda a: " ".join(a[3:6]))
def test_training_explain_shows_the_plans_numbers(args: list[str]) -> None:
    rec, e = _both(args)
    assert (e["layout"]["tp"], e["layout"]["pp"], e["layout"]["dp"]) == (rec["tp"], rec["pp"], rec["dp"])
    metrics = {m["name"]: m["value"] for m in e["metrics"]}
    assert metrics["step time"] == rec["step_time_seconds"]
    assert metrics["throughput"] == rec["tokens_per_second"]
    assert metrics["MFU"] == rec["mfu"]
    assert metrics["micro-batches per step"] == rec["num_micro_batches"]
    assert metrics["bubble"] == rec["bubble_share_of_step"]  # of the step, as the table and Why line

    t = rec["time_breakdown_seconds"]
    assert _segments(e["breakdown"]) == {"compute": t["compute"], "TP comm": t["tp_comm"], "PP comm": t["pp_comm"],
                                         "DP comm exposed": t["dp_comm_exposed"], "bubble": t["bubble"]}

    by_stage = {m["stage"]: m for m in rec["stage_memories"]}
    assert [bar["stages"][0] for bar in e["memory"]] == list(by_stage)
    for bar in e["memory"]:
        m = by_stage[bar["stages"][0]]
        assert _segments(bar) == {"weights": m["weights_bytes"], "gradients": m["gradient_bytes"],
                                  "optimizer": m["optimizer_bytes"], "activations": m["activation_bytes"],
                                  "overhead": m["overhead_bytes"]}

    tp = rec["layer_terms"]["tp"]
    rows = e["collectives"]
    for row in rows:
        if row["phase"] in ("forward", "backward", "recompute"):
            factor = 0.5 if row["kind"] == "AG/RS" else 1.0
            assert row["total_seconds"] == tp["allreduce_seconds"] * factor
            assert row["message_bytes"] == tp["message_bytes"]
        elif row["kind"] == "send":
            assert row["total_seconds"] == rec["pp_send_seconds"]
            assert row["message_bytes"] == rec["pp_send_bytes"]
        elif row["name"].startswith("gradients"):
            assert row["total_seconds"] == rec["dp_collectives"]["gradient_seconds"]
            assert row["message_bytes"] == rec["dp_collectives"]["gradient_bytes"]
        else:
            assert row["total_seconds"] == rec["dp_collectives"]["gather_seconds"]
            assert row["message_bytes"] == rec["dp_collectives"]["weight_bytes"]
    assert any(row["kind"] != "send" for row in rows) or rec["tp"] == 1


def test_explain_takes_the_sglang_plan_apart() -> None:
    """`plan explain --emit sglang` explains what `plan --emit sglang` recommends, at SGLang's KV
    pool (Llama-3.1-405B on 2x8 H100: 420 sequences a replica where vLLM's cache holds more;
    explain had no --emit and showed vLLM's 573, a CLI read). A training launcher is refused."""
    args = ["--model", "llama-3.1-405b", "--cluster", "2x8xH100", "--mode", "aggregated", "--emit", "sglang"]
    rec, e = _json([*args, "--json"])["recommended"], _json(["explain", *args, "--json", "--no-sensitivity"])
    metrics = {m["name"]: m["value"] for m in e["metrics"]}
    assert (e["layout"]["tp"], e["layout"]["pp"], e["layout"]["dp"]) == (rec["tp"], rec["pp"], rec["dp"])
    assert metrics["TPOT"] == rec["tpot_seconds"] and metrics["concurrent sequences per replica"] == rec["batch"]
    vllm = _json(["explain", *args[:-2], "--json", "--no-sensitivity"])
    assert {m["name"]: m["value"] for m in vllm["metrics"]}["concurrent sequences per replica"] > rec["batch"]
    refused = CliRunner().invoke(app, ["explain", *args[:-1], "megatron"])
    assert refused.exit_code == 2 and "--emit megatron" in refused.output


def test_explain_draws_sglangs_pool_under_emit_sglang() -> None:
    """Under --emit sglang the memory bar's KV segment is SGLang's pool and its budget
    --mem-fraction-static of the memory free before load, the numbers of plan's table
    (emit/sglang.pool_figures): explain had drawn vLLM's cache beside SGLang's sequence count."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.emit.sglang import pool_figures
    from planner.requests import ServeRequest
    from planner.serve_search import plan_serving

    args = ["--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--mode", "aggregated", "--emit", "sglang"]
    e = _json(["explain", *args, "--json", "--no-sensitivity"])
    (bar,) = e["memory"]
    segments = _segments(bar)
    request = ServeRequest(pool_engine="sglang", mode="aggregated")
    plan = plan_serving(resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100"), request)
    best = next(r for r in plan.layouts if (r.layout.tp, r.layout.pp, r.layout.dp) == (
        e["layout"]["tp"], e["layout"]["pp"], e["layout"]["dp"]))
    _, pool, static = pool_figures(plan.model, plan.cluster, plan.request, best)
    assert segments["SGLang's KV pool"] == pytest.approx(pool) and bar["budget_bytes"] == pytest.approx(static)
    assert "KV cache" not in segments
