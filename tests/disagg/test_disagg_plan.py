"""The disaggregated search and the auto comparison on the issue's questions (issue 13)."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.catalog import resolve_cluster, resolve_model
from planner.disagg_cli import plan_both
from planner.disagg_search import kv_link, plan_disaggregated
from planner.engines import parse_engine_versions
from planner.requests import ServeRequest
from planner.serve_search import plan_serving

MODEL = "llama-3.1-70b-fp8"
ISSUE = ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=2.0, max_tpot_seconds=0.030)


def both(cluster: str, request: ServeRequest):
    model, spec = resolve_model(MODEL), resolve_cluster(cluster)
    aggregated = plan_serving(model, spec, request)
    disagg, verdict = plan_both(model, spec, request, aggregated.recommended)
    return aggregated, disagg, verdict


def test_issue_question_gives_both_plans_and_a_reasoned_verdict():
    """1x8xH100, 1024/256, TTFT <= 2 s, TPOT <= 30 ms: both plans, a winner with the goodput
    per GPU of each in the reason. (How fast: bench/bench_plan.py's last CLI case, not a timed
    assertion here; about 0.08 s in-process.)"""
    aggregated, disagg, verdict = both("1x8xH100", ISSUE)
    agg, dis = aggregated.recommended, disagg.recommended
    assert agg is not None and dis is not None
    assert dis.ttft_seconds <= 2.0 and dis.tpot_seconds <= 0.030
    assert verdict.winner == ("disaggregated" if dis.goodput_per_gpu > agg.goodput_per_gpu * 1.03 else "aggregated")
    assert f"{dis.goodput_per_gpu:,.0f}" in verdict.reason and f"{agg.goodput_per_gpu:,.0f}" in verdict.reason


def test_loose_sla_aggregated_wins_or_ties():
    """No limits: nothing for disaggregation to protect; aggregated wins or ties (within 3%)."""
    aggregated, disagg, verdict = both("1x8xH100", ServeRequest(input_len=1024, output_len=256))
    assert verdict.winner == "aggregated"
    assert disagg.recommended.goodput_per_gpu <= aggregated.recommended.goodput_per_gpu * 1.03


def test_long_prompts_tight_ttft_says_why():
    """8192/256, TTFT <= 600 ms, TPOT <= 20 ms: whichever wins, the reason names the side that
    binds the disaggregated rate and both goodputs per GPU. (At 500 ms no prefill worker of one
    node meets the TTFT with fp8 GEMMs at vLLM's measured rate.)"""
    request = ServeRequest(input_len=8192, output_len=256, max_ttft_seconds=0.6, max_tpot_seconds=0.020)
    _, disagg, verdict = both("1x8xH100", request)
    assert verdict.winner in ("aggregated", "disaggregated")
    assert "bind" in verdict.reason and "per GPU" in verdict.reason
    assert disagg.recommended.ttft_seconds <= 0.6


def test_two_nodes_split_only_when_the_nic_transfer_fits_the_ttft_budget():
    """2x8xH100: a P/D pairing across nodes is kept only with its TTFT (KV over the NICs
    included) within the limit, and says so; on a 1 Gb/s network the cross-node pairings are
    refused for the KV transfer, and only same-node ones remain."""
    request = ServeRequest(input_len=8192, output_len=256, max_ttft_seconds=0.5, max_tpot_seconds=0.020)
    model, cluster = resolve_model(MODEL), resolve_cluster("2x8xH100")
    plan = plan_disaggregated(model, cluster, request)
    apart = [e for e in plan.candidates if not e.same_node]
    assert apart, "the long-prompt case splits P and D across nodes"
    for e in apart:
        assert e.kv.link_scope == "inter_node" and e.ttft_seconds <= 0.5
        assert any("different nodes" in n and "within --max-ttft-ms" in n for n in e.notes)
    slow_net = cluster.model_copy(update={"inter_node": cluster.inter_node.model_copy(
        update={"nic_bandwidth_gbit_per_s": 0.001, "num_nics_per_node": 1})})
    slow = plan_disaggregated(model, slow_net, request)
    assert all(e.same_node for e in slow.candidates)
    assert any(reason.startswith("KV transfer over") for reason, _ in slow.rejected)
    assert kv_link(cluster, True).kind == "nvlink" and kv_link(cluster, False).scope == "inter_node"


@settings(max_examples=15, deadline=None)
@given(cluster=st.sampled_from(["1x2xH100", "1x4xH100", "1x8xH100", "2x8xH100", "1x8xA100"]),
       input_len=st.sampled_from([128, 1024, 4096]), output_len=st.sampled_from([16, 256]),
       tpot_ms=st.sampled_from([None, 20.0, 50.0]))
def test_disaggregated_goodput_never_counts_a_gpu_twice(cluster, input_len, output_len, tpot_ms):
    request = ServeRequest(input_len=input_len, output_len=output_len,
                           max_tpot_seconds=None if tpot_ms is None else tpot_ms / 1000)
    spec = resolve_cluster(cluster)
    plan = plan_disaggregated(resolve_model("llama-3.1-8b"), spec, request)
    for e in plan.candidates:
        assert e.gpus_used == e.prefill.tp * e.prefill.pp * e.prefill.workers + e.decode.tp * e.decode.pp * e.decode.workers
        assert e.copies * e.gpus_used <= spec.num_gpus == e.plan_gpus
        assert e.goodput_per_gpu == e.goodput_tokens_per_second / e.gpus_used
        # ranked per planned GPU: the copies' goodput over all of them, idle ones included
        assert e.plan_goodput_per_gpu == pytest.approx(e.copies * e.goodput_tokens_per_second / spec.num_gpus)
        assert e.plan_goodput_per_gpu <= e.goodput_per_gpu * (1 + 1e-12)
        assert e.prefill.tp <= spec.gpus_per_node and e.decode.tp <= spec.gpus_per_node
    keys = [-round(e.plan_goodput_per_gpu) for e in plan.candidates]
    assert keys == sorted(keys)


def test_cli_json_adds_keys_only(run_plan):
    args = ("--model", MODEL, "--cluster", "1x8xH100", "--max-ttft-ms", "2000", "--max-tpot-ms", "30", "--json")
    auto = json.loads(run_plan(*args).stdout)
    plain = json.loads(run_plan(*args, "--mode", "aggregated").stdout)
    assert set(plain) <= set(auto)
    # the text's recommendation: the aggregated best unless the disaggregated deployment wins
    won = auto["comparison"]["winner"] == "disaggregated"
    assert auto["recommended_mode"] == ("disaggregated" if won else "aggregated")
    assert auto["best_aggregated" if won else "recommended"] == plain["recommended"]
    if won:
        assert auto["recommended"] == auto["disaggregated"][0]
    best = auto["disaggregated"][0]
    assert best["mode"] == "disaggregated" and auto["mode"] == "auto"
    for role in ("prefill", "decode"):
        assert set(best[role]) >= {"tp", "pp", "workers", "gpus", "concurrency"}
    assert best["kv_transfer_link"] == "nvlink" and best["kv_transfer_seconds"] > 0
    assert auto["comparison"]["winner"] in ("aggregated", "disaggregated")
    # whichever mode wins, `recommended` has the keys both modes share, goodput per planned GPU alike
    shared = {"ttft_seconds", "tpot_seconds", "e2e_seconds", "goodput_tokens_per_second_per_gpu"}
    assert shared <= set(best) and shared <= set(plain["recommended"])
    assert best["goodput_tokens_per_second_per_gpu"] == best["plan_goodput_per_gpu"]
    # the issue's `metrics` and `sla` for the recommended layout, whichever mode it is: a
    # disaggregated deployment's steady state (every request alike), its limits judged
    shared |= {"metrics", "sla"}
    assert shared <= set(best) and shared <= set(plain["recommended"])
    assert best["metrics_source"] == "steady state"
    assert best["metrics"]["ttft_seconds"] == {"mean": best["ttft_seconds"], "median": best["ttft_seconds"],
                                               "p99": best["ttft_seconds"]}
    assert best["metrics"]["output_throughput_tokens_per_second"] == pytest.approx(
        best["plan_goodput_tokens_per_second"])
    assert best["sla"] == {"ttft_ok": True, "tpot_ok": True, "e2e_ok": True, "binding": best["binding"]}
    assert all(entry["metrics"] is None for entry in auto["disaggregated"][1:])
    aggregated = plain["recommended"]
    assert aggregated["goodput_tokens_per_second_per_gpu"] == pytest.approx(
        aggregated["goodput_tokens_per_second"] / 8)


def test_cli_table_and_mode_errors(run_plan):
    out = run_plan("--model", MODEL, "--cluster", "1x8xH100", "--max-ttft-ms", "2000", "--max-tpot-ms", "30",
                   "--mode", "disaggregated")
    assert out.returncode == 0, out.stderr
    assert "Disaggregated prefill/decode" in out.stdout and "Recommended (--mode disaggregated):" in out.stdout
    bad = run_plan("--model", MODEL, "--cluster", "1x8xH100", "--mode", "split")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    train = run_plan("--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                     "--global-batch", "8", "--seq-len", "1024", "--mode", "auto")
    assert train.returncode == 2


def test_explain_draws_disaggregated_mode_and_refuses_it_for_training(run_plan):
    """issue 13, item 5: `plan explain --mode disaggregated` draws the P/D deployment
    (tests/explain/test_explain_disagg.py); with --workload train it is one line, exit 2."""
    out = run_plan("explain", "--model", MODEL, "--cluster", "1x8xH100", "--input-len", "1024", "--output-len",
                   "256", "--max-ttft-ms", "2000", "--max-tpot-ms", "30", "--mode", "disaggregated")
    assert out.returncode == 0, out.stderr
    assert "A request's path" in out.stdout
    train = run_plan("explain", "--workload", "train", "--model", "llama-3.1-8b", "--cluster", "1x8xH100",
                     "--mode", "disaggregated")
    assert train.returncode == 2 and len(train.stderr.strip().splitlines()) == 1


def test_no_deployment_says_why_not_the_sla_when_none_is_set():
    """One GPU: no prefill + decode pair exists; no SLA is set, so the reason is the GPU count,
    not "meets the SLA"."""
    model, request = resolve_model("llama-3.1-8b"), ServeRequest(input_len=1024, output_len=256)
    plan, verdict = plan_both(model, resolve_cluster("1x1xH100"), request,
                              plan_serving(model, resolve_cluster("1x1xH100"), request).recommended)
    assert plan.candidates == () and "at least 2 GPUs" in plan.why_none and "this plan has 1" in plan.why_none
    assert verdict.winner == "aggregated" and "SLA" not in verdict.reason


def test_no_deployment_within_an_impossible_sla_names_the_sla():
    model, cluster = resolve_model(MODEL), resolve_cluster("1x8xH100")
    plan = plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256, max_tpot_seconds=1e-5))
    assert plan.candidates == () and plan.why_none == "none meets the SLA" and plan.rejected


def test_an_e2e_limit_below_the_first_token_cost_rejects_every_pairing():
    """--max-e2e-ms 10 leaves nothing after the first token's fixed cost: the TPOT it implies
    for decode workers is 0 (e2e_implied_tpot_seconds), which once became a --max-tpot-ms of 0
    and an exit-2 error blaming that flag. No implied concurrency is tried; every pairing is
    priced and rejected for its E2E."""
    from planner.disagg_search import e2e_implied_tpot_seconds

    model, cluster = resolve_model(MODEL), resolve_cluster("1x8xH100")
    request = ServeRequest(input_len=1024, output_len=256, max_e2e_seconds=0.010)
    assert e2e_implied_tpot_seconds(request) == 0.0
    plan = plan_disaggregated(model, cluster, request)
    assert plan.candidates == () and plan.why_none == "none meets the SLA"
    assert any("E2E latency exceeds --max-e2e-ms" in why for why in plan.rejected)


def test_a_plan_with_candidates_has_no_reason_for_none():
    model, cluster = resolve_model(MODEL), resolve_cluster("1x8xH100")
    assert plan_disaggregated(model, cluster, ISSUE).why_none == ""


def test_batch_caps_the_decode_workers_concurrency_as_it_caps_a_replica():
    """--batch 8 is the concurrency per replica the user runs; a decode worker is a replica too,
    so no decode worker runs more than 8 sequences (it ran 272 before)."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100")
    plan = plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256, batch=8))
    assert plan.candidates and all(e.decode.concurrency <= 8 for e in plan.candidates)
    unbounded = plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256))
    assert max(e.decode.concurrency for e in unbounded.candidates) > 8


def test_mode_disaggregated_launches_the_disaggregated_plan_even_when_aggregated_would_win():
    """--mode disaggregated is the user's choice: the plan it asked for is recommended and
    launched; the comparison with aggregated is said, not acted on (70B bf16 on 1x8xH100:
    aggregated serves more per GPU)."""
    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(app, ["--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--mode", "disaggregated"])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())
    assert "Recommended (--mode disaggregated):" in flat and "aggregated wins" in flat
    assert "Launch disaggregated (vllm):" in flat and "kv_connector" in flat


def test_a_worker_moves_no_more_kv_than_its_links_carry():
    """Each GPU carries S/n of a prompt's KV in T_x, so a worker of g GPUs moves (g / n) / T_x
    prompts per second: n = 1 stream, T_x = 0.1 s, g = 4: 40 prompts/s."""
    from planner.cost.kv_transfer import KvTransfer, kv_link_requests_per_second

    transfer = KvTransfer(1e8, "ethernet", "inter_node", 1, 0.1, "model")
    assert kv_link_requests_per_second(transfer, 4) == 40.0


def test_a_slow_kv_link_caps_the_disaggregated_rate(tmp_path):
    """Two one-GPU nodes joined by one 10 Gbit/s NIC each (1.25 GB/s): Llama-3.1-8B's 1,024-token
    prompt holds 128 KiB/token x 1,024 = 128 MiB of KV, so the link moves at most
    1.25e9 / 134,217,728 = 9.3 prompts/s (less its 20 us per layer): the rate cannot exceed
    that, whatever the GPUs compute (an H100 prefills some 30 such prompts a second), and the
    plan says the link binds."""
    from planner.catalog import load_cluster

    profile = tmp_path / "eth2x1.yaml"
    profile.write_text("name: eth2x1\nnum_nodes: 2\ngpus_per_node: 1\ngpu: H100-SXM5-80GB\n"
                       "inter_node: {kind: ethernet, num_nics_per_node: 1, nic_bandwidth_gbit_per_s: 10, latency_us: 20}\n")
    cluster = load_cluster(profile)
    best = plan_disaggregated(resolve_model("llama-3.1-8b"), cluster, ServeRequest(input_len=1024, output_len=256)).recommended
    assert best is not None
    assert best.kv.bytes_per_request == 128 * 1024 * 1024
    assert best.requests_per_second <= 1.25e9 / (128 * 1024 * 1024)
    assert best.requests_per_second > 0.9 * 1.25e9 / (128 * 1024 * 1024)
    assert any("the KV link binds" in note for note in best.notes)


def test_disaggregated_mode_json_recommends_what_the_text_does():
    """--mode disaggregated: JSON `recommended` is the disaggregated deployment the text
    recommends (null when none meets the SLA, exit 1), not the aggregated layout kept for the
    comparison."""
    from typer.testing import CliRunner

    from planner.cli import app

    base = ["--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--mode", "disaggregated", "--json"]
    done = CliRunner().invoke(app, base)
    payload = json.loads(done.output)
    assert done.exit_code == 0 and payload["recommended"] == payload["disaggregated"][0]
    assert payload["recommended"]["mode"] == "disaggregated"
    none = CliRunner().invoke(app, [*base, "--max-ttft-ms", "100"])
    assert none.exit_code == 1 and json.loads(none.output)["recommended"] is None


def test_decode_workers_are_never_pipelined():
    """vLLM 0.33.0's NixlConnector refuses a kv_consumer with pipeline_parallel_size > 1
    (nixl/base_worker.py): no deployment pairs a pipelined decode worker, and the rejections
    say why; prefill workers may pipeline."""
    from planner.disagg_search import PIPELINED_DECODE

    plan = plan_disaggregated(resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100"),
                              ServeRequest(input_len=1024, output_len=256))
    assert plan.candidates and all(c.decode.pp == 1 for c in plan.candidates)
    assert dict(plan.rejected)[PIPELINED_DECODE] > 0


def test_pipelined_prefill_workers_push_their_kv_and_only_where_vllm_can():
    """vLLM 0.33.0's pull NixlConnector reads the prefill's stage 0 only (its decode side keys
    remote agents by TP rank), so Llama-3.1-70B on 2x8 H100 was launched with a tp=1 pp=8
    prefill worker on the pull connector, which fails at the first handshake (layer counts
    differ). Such a deployment now names NixlPushConnector on both roles; vLLM 0.22.0, whose
    NIXL connector only pulls, gets no pipelined prefill worker, and a hybrid (Mamba) model none
    on 0.33.0 either (the push path refuses pipelined SSM state)."""
    from planner.disagg_search import (
        PIPELINED_PREFILL_PULL_ONLY,
        PIPELINED_PREFILL_RECURRENT,
        pipelined_decode_reason,
    )
    from planner.emit.disagg import nixl_connector

    model = resolve_model("llama-3.1-70b")
    plan = plan_disaggregated(model, resolve_cluster("2x8xH100"), ServeRequest(input_len=1024, output_len=256))
    assert any(c.prefill.pp > 1 for c in plan.candidates)
    old = ServeRequest(input_len=1024, output_len=256, engine_versions=parse_engine_versions("vllm=0.22.0"))
    plan_022 = plan_disaggregated(model, resolve_cluster("2x8xH100"), old)
    assert plan_022.candidates and all(c.prefill.pp == 1 for c in plan_022.candidates)
    assert dict(plan_022.rejected)[PIPELINED_PREFILL_PULL_ONLY.format(version="0.22.0")] > 0
    hybrid = model.model_copy(update={"num_recurrent_layers": 40, "recurrent_kind": "mamba2"})
    assert pipelined_decode_reason(hybrid, (1, 8, 1), (8, 1, 1), "vllm", ServeRequest()) == PIPELINED_PREFILL_RECURRENT
    assert pipelined_decode_reason(hybrid, (8, 1, 1), (8, 1, 1), "vllm", ServeRequest()) is None
    args = SimpleNamespace(pp=8)
    assert nixl_connector(args) == "NixlPushConnector" and nixl_connector(SimpleNamespace(pp=1)) == "NixlConnector"


def test_sglang_decode_workers_pipeline_with_prefill_workers_of_as_many_stages():
    """SGLang 0.5.23 runs a decode worker over pipeline stages (disaggregation/decode.py: the
    stages agree on each step's requests) fed by a prefill worker of as many stages
    (CommonKVReceiver asserts decode pp == prefill pp or 1). Llama-3.1-405B (756 GiB bf16) on
    4x8 H100: no decode worker fits one node, so vLLM has no deployment (every pairing needs a
    pipelined consumer) and SGLang's pairs P and D of equal pp; the other pairings are rejected
    for the stage mismatch. vLLM's wording stays vLLM's."""
    from planner.disagg_search import PIPELINED_DECODE, PIPELINED_DECODE_STAGES

    model, cluster = resolve_model("llama-3.1-405b"), resolve_cluster("4x8xH100")
    request = ServeRequest(input_len=2048, output_len=256)
    vllm = plan_disaggregated(model, cluster, request)
    assert not vllm.candidates and dict(vllm.rejected)[PIPELINED_DECODE] > 0
    sglang = plan_disaggregated(model, cluster, request, engine="sglang")
    assert sglang.candidates
    assert all(c.decode.pp > 1 and c.decode.pp == c.prefill.pp for c in sglang.candidates)
    assert PIPELINED_DECODE not in dict(sglang.rejected)
    assert dict(sglang.rejected)[PIPELINED_DECODE_STAGES] > 0


def test_pipelined_decode_rules_by_engine_and_release():
    """pipelined_decode_reason: pp = 1 decode always pairs; vLLM never takes a pipelined one;
    SGLang 0.5.10.post1 (not read) is not planned; 0.5.23 wants the prefill's stages, and for a
    sliding-window model without MLA (gpt-oss) the prefill's TP size too."""
    from planner.disagg_search import (
        PIPELINED_DECODE,
        PIPELINED_DECODE_STAGES,
        PIPELINED_DECODE_UNPRICED,
        PIPELINED_DECODE_WINDOW,
        pipelined_decode_reason,
    )
    from planner.engines import EngineVersions

    dense, window = resolve_model("llama-3.1-70b"), resolve_model("gpt-oss-120b")
    new, old = ServeRequest(), ServeRequest(engine_versions=EngineVersions(sglang="0.5.10.post1"))
    assert pipelined_decode_reason(dense, (8, 2, 1), (8, 1, 1), "vllm", new) is None
    assert pipelined_decode_reason(dense, (8, 2, 1), (8, 2, 1), "vllm", new) == PIPELINED_DECODE
    assert pipelined_decode_reason(dense, (8, 2, 1), (8, 2, 1), "sglang", old) == \
        PIPELINED_DECODE_UNPRICED.format(version="0.5.10.post1")
    assert pipelined_decode_reason(dense, (8, 2, 1), (8, 2, 1), "sglang", new) is None
    assert pipelined_decode_reason(dense, (8, 1, 1), (8, 2, 1), "sglang", new) == PIPELINED_DECODE_STAGES
    assert pipelined_decode_reason(dense, (4, 2, 1), (8, 2, 1), "sglang", new) is None
    assert pipelined_decode_reason(window, (4, 2, 1), (8, 2, 1), "sglang", new) == PIPELINED_DECODE_WINDOW
    assert pipelined_decode_reason(window, (8, 2, 1), (8, 2, 1), "sglang", new) is None


def test_kv_transfer_into_decode_stages_by_hand():
    """Each decode stage pulls its own layers: n = min(t_P p_P, t_D p_D) streams. 80 layers of
    10 MB each (800 MB) over a 100 GB/s link with no latency: tp=2 pp=2 -> tp=2 pp=2 is 4 streams,
    80 messages of 2.5 MB, 25 us each, T_x = 2 ms; into tp=2 pp=1 (2 receivers), 4 ms. MLA: p_D
    streams of S / p_D to each of the t_D ranks: pp=2 tp=4, 2 streams (copies 4), 4 ms."""
    from planner.cost.kv_transfer import LayerKv, kv_transfer
    from planner.layout import Link

    link = Link("infiniband", "inter_node", 100e9, 0.0)
    layers = (LayerKv(80, 10e6),)
    staged = kv_transfer(layers, 2, 2, link, None, prefill_pp=2, decode_pp=2)
    assert staged.num_streams == 4 and staged.transfer_seconds == pytest.approx(80 * 2.5e6 / 100e9)
    flat = kv_transfer(layers, 2, 2, link, None, prefill_pp=2, decode_pp=1)
    assert flat.num_streams == 2 and flat.transfer_seconds == pytest.approx(0.004)
    mla = kv_transfer(layers, 4, 4, link, None, mla=True, prefill_pp=2, decode_pp=2)
    assert (mla.num_streams, mla.copies) == (2, 4) and mla.transfer_seconds == pytest.approx(0.004)


def test_disaggregated_mode_json_drops_the_aggregated_alternatives():
    """--mode disaggregated recommends workers; the aggregated plan's alternatives (the layout
    without drafts, other MoE backends) price its own best layout, so they are left out."""
    from typer.testing import CliRunner

    from planner.cli import app

    payload = json.loads(CliRunner().invoke(app, [
        "--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--mode", "disaggregated", "--speculative-method",
        "ngram", "--num-speculative-tokens", "2", "--draft-acceptance", "0.5", "--json"]).output)
    assert payload["recommended"]["mode"] == "disaggregated"
    assert payload["speculation_options"] == [] and payload["speculation_break_even_factor"] is None


def test_auto_mode_recommends_the_disaggregated_deployment_when_it_wins():
    """--mode auto prints the aggregated plan first; when the disaggregated deployment wins the
    comparison, the aggregated best is headed as the alternative ("Best aggregated ...", its
    launch "instead") and the one "Recommended:" line names the disaggregated deployment
    (gpt-oss-120b on 2x8xH100, 8,192/1,024 tokens, TTFT <= 2 s, TPOT <= 30 ms: disaggregated
    serves about 1.5x the output tokens per GPU)."""
    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(app, ["--model", "gpt-oss-120b", "--cluster", "2x8xH100", "--input-len", "8192",
                                      "--output-len", "1024", "--max-ttft-ms", "2000", "--max-tpot-ms", "30"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    headlines = [line for line in lines if line.startswith("Recommended:")]
    assert len(headlines) == 1 and headlines[0].startswith("Recommended: disaggregated P ")
    assert any(line.startswith("Best aggregated (disaggregated wins, below): tp=") for line in lines)
    assert lines.index(headlines[0]) > next(i for i, line in enumerate(lines) if line.startswith("Best aggregated"))
    flat = " ".join(result.stdout.split())
    assert "Launch the best aggregated layout instead (vllm" in flat and "Launch disaggregated (vllm):" in flat


def test_a_deployment_smaller_than_the_cluster_runs_copies_and_is_ranked_on_all_gpus():
    """Llama-3.1-70B on 6x8xH100 (TTFT <= 1 s, TPOT <= 30 ms): the best disaggregated unit
    (16 GPUs) is smaller than the cluster and runs as copies that fill it; ranked per planned
    GPU, idle GPUs count (ranked per GPU it used, a 44-GPU deployment had won on 8x8xH100 at
    621 tok/s per GPU: 27,329 tok/s in all on the 64, 20 idle, against some 36,000-40,000 for
    copies that fill them). (On 8x8xH100 one 64-GPU deployment now wins: its pipelined prefill
    workers are priced as vLLM's batch queue runs them, disaggregated.pipelined_prefill_seconds.)"""
    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(app, ["--model", "llama-3.1-70b", "--cluster", "6x8xH100", "--max-ttft-ms", "1000",
                                      "--max-tpot-ms", "30"])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.stdout.split())
    assert "Recommended: disaggregated P " in flat
    found = re.search(r"(\d+) copies of its (\d+) GPUs on the 48: ([\d,]+) output tok/s in all", flat)
    assert found, flat
    copies, gpus, total = int(found[1]), int(found[2]), int(found[3].replace(",", ""))
    assert copies > 1 and copies * gpus == 48 and total > 0
    assert re.search(rf"│\s*{copies}x{gpus}\s*│", result.stdout)
    assert f"run {copies} copies on 48 of the 48 GPUs, each with its own proxy" in flat


def test_the_decode_launch_cap_above_c_d_is_explained():
    """Llama-3.1-70B on 1x8xH100, TPOT <= 50 ms: the decode worker runs C_d sequences at the
    matched rate and is launched with the larger --max-num-seqs the TPOT limit allows; the
    plan says which is which, and JSON carries both."""
    from typer.testing import CliRunner

    from planner.cli import app

    args = ["--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--max-tpot-ms", "50"]
    flat = " ".join(CliRunner().invoke(app, args).stdout.split())
    found = re.search(r"the decode workers run (\d+) sequences at the matched rate \(C_d\); they are "
                      r"launched for (\d+) \(vLLM's --max-num-seqs", flat)
    assert found and int(found[2]) > int(found[1])
    best = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)["disaggregated"][0]["decode"]
    assert best["max_num_seqs"] == int(found[2]) and round(best["concurrency"]) == int(found[1])


def test_decode_concurrency_at_rate_by_hand():
    """Little's law on a decode rank, C = R * O * T_d(C): with T_d(C) = 10 ms + 0.1 ms * C,
    R = 20 requests/s and O = 256, C = 5,120 * (0.01 + 0.0001 C) = 51.2 + 0.512 C, so
    C = 51.2 / 0.488 = 104.92 sequences at T_d = 20.49 ms (T_d at the cap of 200 is 30 ms, which
    gave 5,120 * 0.03 = 153.6); a rate the cap cannot hold stays at the cap."""
    from planner.cost.disaggregated import decode_concurrency_at_rate

    def round_seconds(c: float) -> float:
        return 0.01 + 0.0001 * c

    assert decode_concurrency_at_rate(20.0, 256, round_seconds, 200) == pytest.approx(51.2 / 0.488, rel=1e-5)
    assert decode_concurrency_at_rate(100.0, 256, round_seconds, 200) == 200


def test_closed_loop_rate_by_hand():
    """Little's law over closed-loop clients, clients = R * E2E(R): with E2E(R) = 2 s + 0.1 s per
    request/s and a capacity of 10 /s, 8 clients give 0.1 R^2 + 2 R - 8 = 0, R = (-2 + sqrt(4 +
    3.2)) / 0.2 = 3.4164 /s (E2E 2.3416 s); 30 clients fill the capacity exactly (10 /s * 3 s)
    and more than that leave it at 10 /s (they wait client-side)."""
    import math

    from planner.cost.disaggregated import closed_loop_rate

    def e2e(rate: float) -> float:
        return 2.0 + 0.1 * rate

    rate = closed_loop_rate(8, 10.0, e2e)
    assert rate == pytest.approx((-2 + math.sqrt(7.2)) / 0.2, rel=1e-4)  # to the bisection's tolerance
    assert rate == pytest.approx(3.4164, abs=1e-3)
    assert rate * e2e(rate) == pytest.approx(8, rel=1e-4)
    assert closed_loop_rate(30, 10.0, e2e) == 10.0
    assert closed_loop_rate(1000, 10.0, e2e) == 10.0


def test_closed_loop_rate_where_e2e_dips():
    """E2E 2 s below 6 /s and 1.5 s from it (a decode round that shortens past the fused
    all-reduce's size), capacity 10 /s, 8 clients: at capacity 15 in flight; the lower bound
    clients / E2E(10 /s) = 8 / 1.5 = 5.33 /s holds 5.33 * 2 = 10.7 (not 8: taking it as R broke
    Little's law), so R is below it: 8 / 2 s = 4 /s, 8 in flight. With an upper bound under R
    (3 /s, excess -2) the bracket widens to the capacity first and lands there too."""
    from planner.cost.disaggregated import closed_loop_rate

    def e2e(rate: float) -> float:
        return 2.0 if rate < 6 else 1.5

    for upper in (None, 3.0):
        rate = closed_loop_rate(8, 10.0, e2e, upper)
        assert rate == pytest.approx(4.0, rel=1e-4)
        assert rate * e2e(rate) == pytest.approx(8, rel=1e-4)


@settings(max_examples=50, deadline=None)
@given(clients=st.floats(0.1, 1e4), capacity=st.floats(0.01, 1e3), base=st.floats(0.01, 100),
       slope=st.floats(0, 10))
def test_closed_loop_rate_keeps_littles_law(clients, capacity, base, slope):
    """Below the capacity the clients in flight are exactly R * E2E(R); never above it, and more
    clients never lower the rate."""
    from planner.cost.disaggregated import closed_loop_rate

    def e2e(rate: float) -> float:
        return base + slope * rate

    rate = closed_loop_rate(clients, capacity, e2e)
    assert 0 <= rate <= capacity
    if rate < capacity:
        assert rate * e2e(rate) == pytest.approx(clients, rel=1e-3)
    assert closed_loop_rate(clients * 2, capacity, e2e) >= rate


def test_e2e_implied_tpot_by_hand():
    """--max-e2e-ms 5000, O = 256, no speculation: every token takes a decode round, the first after
    the first-token cost (10 ms + the prompt's tokenization on the prefill server and again on
    the decode server, vLLM's proxy handing each the text: 2 x 1,024 x 1.7 us = 3.4816 ms) and,
    under async scheduling (the default), the decode step scheduled ahead, so
    T_d <= (5 s - 13.4816 ms) / (255 + 2), (255 + 1) without it; a tighter TPOT limit wins.
    Behind SGLang's router, which sends both servers the request at once: one tokenization."""
    from planner.disagg_search import e2e_implied_tpot_seconds

    request = ServeRequest(input_len=1024, output_len=256, max_e2e_seconds=5.0)
    assert e2e_implied_tpot_seconds(request) == pytest.approx((5.0 - 0.0134816) / 257)
    sglang = ServeRequest(input_len=1024, output_len=256, max_e2e_seconds=5.0, pool_engine="sglang")
    assert e2e_implied_tpot_seconds(sglang) == pytest.approx((5.0 - 0.0117408) / 257)
    off = ServeRequest(input_len=1024, output_len=256, max_e2e_seconds=5.0, async_scheduling=False)
    assert e2e_implied_tpot_seconds(off) == pytest.approx((5.0 - 0.0134816) / 256)
    tight = ServeRequest(input_len=1024, output_len=256, max_e2e_seconds=5.0, max_tpot_seconds=0.01)
    assert e2e_implied_tpot_seconds(tight) == 0.01


def test_an_e2e_limit_lowers_the_decode_concurrency_to_meet_it():
    """70B on two H100 nodes with --max-e2e-ms 5000: the decode workers at the TPOT-free cap take
    more than 5 s per request, and a lower concurrency meets it (a stricter --max-tpot-ms 15
    found one, so an E2E limit alone must too). Every row meets the limit and obeys Little's law
    on its decode ranks: C_d = R / (N_d d) * O * TPOT."""
    request = ServeRequest(input_len=1024, output_len=256, max_e2e_seconds=5.0)
    plan = plan_disaggregated(resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100"), request)
    assert plan.candidates
    for e in plan.candidates:
        assert e.e2e_seconds <= 5.0
        decode_ranks = e.decode.workers * e.decode.dp
        little = e.requests_per_second / decode_ranks * 256 * e.tpot_seconds
        assert e.decode.concurrency == pytest.approx(little, rel=0.01)


@settings(max_examples=10, deadline=None)
@given(cluster=st.sampled_from(["1x8xH100", "2x8xH100", "2x8xA100"]), input_len=st.sampled_from([512, 4096]),
       ttft_ms=st.sampled_from([None, 500.0]))
def test_decode_ranks_obey_littles_law(cluster, input_len, ttft_ms):
    """Whichever side binds, each decode rank runs the sequences its share of the rate keeps in
    flight: C_d = R / (N_d d) * O * T_d at the T_d reported (before: T_d at the most sequences
    the worker could run, 153.8 against 80.7 on 70B over two H100 nodes)."""
    request = ServeRequest(input_len=input_len, output_len=256,
                           max_ttft_seconds=None if ttft_ms is None else ttft_ms / 1000)
    plan = plan_disaggregated(resolve_model("llama-3.1-70b"), resolve_cluster(cluster), request)
    for e in plan.candidates:
        little = e.requests_per_second / (e.decode.workers * e.decode.dp) * 256 * e.tpot_seconds
        # within 1%: a round's time steps where its rows round to a whole sequence (122.5 on A100)
        assert e.decode.concurrency == pytest.approx(little, rel=0.01)


def test_latency_objective_with_disaggregated_mode_is_refused(run_plan):
    """--objective latency --mode disaggregated asked for the latency-best workers, but
    disaggregated workers are sized for goodput under load (they ranked by it): a mistake in the
    input, one line, exit 2 (auto mode says aggregated wins on latency)."""
    result = run_plan("--model", "llama-3.1-70b", "--cluster", "2x8xH100", "--objective", "latency",
                      "--mode", "disaggregated")
    assert result.returncode == 2 and not result.stdout
    assert len(result.stderr.strip().splitlines()) == 1 and "--objective latency" in result.stderr


def test_an_e2e_limit_finds_the_decode_concurrency_between_halvings():
    """70B on two H100 nodes, --max-e2e-ms 3000: the E2E limit's implied TPOT allows 8 sequences,
    which miss at the matched rate once the TTFT under load is added; the halving to 4 meets it at
    22 tok/s per GPU, but 6 meets it too (E2E 2.978 s) at 32.9, and the search tries each quarter
    of the bound (e2e_caps) and bisects the best pairings that miss (_largest_meeting_e2e); 8
    loaded below their matched rate to E2E's limit (e2e_limited) serve more yet."""
    from planner.disagg_search import e2e_caps

    assert e2e_caps(8) == [1, 2, 4, 6, 8] and e2e_caps(64) == [8, 16, 32, 48, 64]
    assert e2e_caps(0) == []  # no concurrency meets the TPOT: none is tried
    request = ServeRequest(input_len=1024, output_len=256, max_e2e_seconds=3.0)
    best = plan_disaggregated(resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100"), request).recommended
    assert best is not None and best.e2e_seconds <= 3.0
    # 6 sequences at the matched rate serve 32.9; 8 run below their matched rate, at the most
    # that meets E2E (e2e_limited), serve more: 34.0
    assert best.plan_goodput_per_gpu > 33.5
    assert (best.decode.max_num_seqs, best.binding) == (8, "e2e")


@pytest.mark.parametrize("model_name, cluster_name, e2e_seconds", [("mixtral-8x7b", "2x8xA100", 3.0),
                                                                    ("qwen3-30b-a3b", "2x8xH200", 1.5),
                                                                    ("llama-3.1-70b", "2x8xH100", 3.0)])
def test_the_e2e_shortcuts_skip_only_what_would_miss(monkeypatch, model_name, cluster_name, e2e_seconds):
    """With --max-e2e-ms the search skips a pairing without pricing it where a bound proves the
    miss (the zero-load floor, a lower bound from Little's law iterated from below, and count
    pairs loaded at least as much as one that missed): the same candidates and the same
    rejection counts as pricing every one (mixtral on 16 A100 5.2 s -> 0.8 s, Qwen3-30B on 128
    H200 72 s -> 3.7 s, found by a CLI sweep; on 16 H200, the case here, 4.7 s -> 1.0 s)."""
    import planner.disagg_search as ds

    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    request = ServeRequest(max_e2e_seconds=e2e_seconds)
    fast = plan_disaggregated(model, cluster, request)
    monkeypatch.setattr(ds, "e2e_floor_seconds", lambda *args: 0.0)
    monkeypatch.setattr(ds, "e2e_lower_bound_seconds", lambda *args: 0.0)
    calls = itertools.count(1)  # each pairing less loaded than any before it: none dominated
    monkeypatch.setattr(ds, "worker_loads", lambda *args: (-float(next(calls)),) * 2)
    slow = plan_disaggregated(model, cluster, request)
    # the same candidates; those run below their matched rate (e2e_limited) at rates found to its
    # tolerance from the bound's ceiling (e2e_rate_ceiling), which the shortcuts' absence moves,
    # and, where two copies of a deployment serve as one twice its size, either of the two
    assert len(fast.candidates) == len(slow.candidates)
    for a, b in zip(fast.candidates, slow.candidates, strict=True):
        assert a.binding == b.binding
        if a.binding != ds.E2E_BINDING:
            assert a == b
        assert a.plan_goodput_per_gpu == pytest.approx(b.plan_goodput_per_gpu, rel=2 * ds.E2E_RATE_TOLERANCE)
    assert fast.rejected == slow.rejected


def test_sglang_decode_workers_are_priced_at_what_their_pool_holds(run_plan):
    """Llama-3.1-8B on 8 H100, --mode disaggregated --emit sglang: the decode workers are sized by
    SGLang's reserve-capped pool (disagg_search.decode_concurrency), so their command's
    --max-running-requests is the max_num_seqs the plan prices, and no launch note says the
    command runs fewer than priced (it did, 831 against 846 priced, before the search priced
    SGLang's pool)."""
    import json as _json

    result = run_plan("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--mode", "disaggregated",
                      "--emit", "sglang", "--json")
    best = _json.loads(result.stdout)["disaggregated"][0]
    assert not any("the plan prices" in note for note in best["launch_notes"])
    (decode,) = [step["argv"] for step in best["launch"] if step["role"] != "prefill" and "decode" in step["argv"]]
    assert decode[decode.index("--max-running-requests") + 1] == str(best["decode"]["max_num_seqs"])
    assert best["decode"]["concurrency"] <= best["decode"]["max_num_seqs"]


def test_a_disaggregated_win_at_a_much_longer_ttft_says_so():
    """Winning on goodput with its prefill workers near capacity (no limit set), a deployment
    whose TTFT is over 1.5x the aggregated layout's says so and names the flag that prices the
    trade (70B on 8 H100 at 2,048/512: 935 against 274 ms, found by a CLI sweep); within 1.5x,
    or under an SLA that admitted it, nothing or only the numbers."""
    from types import SimpleNamespace

    from planner.disagg_cli import latency_clause

    aggregated = SimpleNamespace(ttft_seconds=0.274)
    slow, near = (SimpleNamespace(ttft_seconds=t, binding="prefill") for t in (0.935, 0.400))
    clause = latency_clause(aggregated, slow, has_sla=False)
    assert clause == ("; at TTFT 935 ms against 274 ms aggregated, its prefill workers near capacity with no "
                      "limit set; --max-ttft-ms prices the trade")
    assert latency_clause(aggregated, slow, has_sla=True) == "; at TTFT 935 ms against 274 ms aggregated"
    assert latency_clause(aggregated, near, has_sla=False) == ""
    # client-bound (--max-concurrency): the prefill workers are not near capacity, and it says how busy
    clients = SimpleNamespace(ttft_seconds=0.284, binding="clients", prefill_load=SimpleNamespace(utilization=0.26),
                              prefill=SimpleNamespace(shape_label="tp=2 pp=2"))
    assert latency_clause(SimpleNamespace(ttft_seconds=0.115), clients, has_sla=False) == (
        "; at TTFT 284 ms against 115 ms aggregated, its prompts on tp=2 pp=2 prefill workers (26% busy); "
        "--max-ttft-ms prices the trade")


def test_disaggregated_mode_prices_max_concurrency_as_a_closed_loop(run_plan):
    """--mode disaggregated --max-concurrency 8 (no burst flags): each deployment at the rate its
    clients keep it at (binding clients, Little's law per copy), more clients never fewer
    requests/s per copy; the burst's own flags stay refused in this mode (exit 2, one line)."""
    import json as _json

    base = ("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--input-len", "1024", "--output-len", "256",
            "--mode", "disaggregated", "--json")
    few, many = (_json.loads(run_plan(*base, "--max-concurrency", str(c)).stdout)["disaggregated"][0]
                 for c in (8, 64))
    assert few["binding"] == "clients"
    assert few["requests_per_second"] * few["e2e_seconds"] == pytest.approx(8 / few["copies"], rel=1e-3)
    assert many["plan_goodput_per_gpu"] > few["plan_goodput_per_gpu"]
    refused = run_plan(*base, "--max-concurrency", "8", "--num-prompts", "80")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert refused.stderr.startswith("--num-prompts: the burst is simulated for aggregated replicas only")


def test_clients_fewer_than_copies_leave_copies_idle(run_plan):
    """C = q k + r clients over k copies: r copies run q + 1, the rest q, as aggregated replicas
    split them. 8B on 8 H100, the best-ranked deployment of two copies of 4 GPUs (one copy of all 8
    ranks first since clients_rate_bound orders the search): one client keeps one copy at 1 / E2E
    and leaves the other idle, so the mean per copy is half of that; two clients keep both busy."""
    import json as _json

    def best(clients: int) -> dict:
        result = run_plan("--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--input-len", "1024",
                          "--output-len", "256", "--mode", "disaggregated", "--max-concurrency", str(clients),
                          "--top", "40", "--json")
        return next(e for e in _json.loads(result.stdout)["disaggregated"] if e["copies"] == 2)

    one, two = best(1), best(2)
    assert one["requests_per_second"] == pytest.approx(0.5 / one["e2e_seconds"], rel=1e-3)
    assert two["requests_per_second"] == pytest.approx(1 / two["e2e_seconds"], rel=1e-3)
    assert any("(1 client on 1 of them, 0 on the rest)" in note for note in one["notes"])


def test_vllm_ray_is_refused_for_disaggregated_commands():
    """Its disaggregated commands were the plain vLLM ones under a "(vllm-ray)" heading."""
    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--mode", "disaggregated",
                                      "--emit", "vllm-ray"])
    assert result.exit_code == 2 and "--emit vllm-ray: the disaggregated servers" in result.output


def test_mode_disaggregated_with_nothing_meeting_the_sla_says_only_why_no_deployment():
    """It said "no aggregated layout fits ...; no disaggregated deployment: ..." though the
    user asked for disaggregated deployments only."""
    from typer.testing import CliRunner

    from planner.cli import app

    result = CliRunner().invoke(app, ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--mode", "disaggregated",
                                      "--max-ttft-ms", "1"])
    assert result.exit_code == 1
    assert "Recommended: none: no disaggregated deployment: none meets the SLA" in " ".join(result.output.split())
    assert "no aggregated layout" not in result.output


def test_top_above_ten_shows_more_deployments():
    """--top 25 on Llama-3.1-70B over 2x8 H100 showed 10 rows (the search priced 10 in full);
    it prices as many as asked: 24 combinations there (every one not rejected), the first ten
    the same as before, in the same order."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    request = ServeRequest(input_len=1024, output_len=256)
    ten = plan_disaggregated(model, cluster, request).candidates
    more = plan_disaggregated(model, cluster, request, shown=25).candidates
    assert len(ten) == 10 and 10 < len(more) <= 25
    assert [(e.prefill, e.decode) for e in more[:10]] == [(e.prefill, e.decode) for e in ten]
    assert len(plan_disaggregated(model, cluster, request, shown=3).candidates) == 10  # never fewer than 10


def test_clients_past_a_copys_capacity_queue_for_its_prefill_workers():
    """queued_at_capacity by hand: a copy taking 2 req/s at a 5 s E2E holds 10 requests; 20
    clients keep 20 in flight, so E2E = 20 / 2 = 10 s and the 5 s more wait in TTFT (1 -> 6 s);
    10 clients or fewer leave it as found; --max-ttft-ms 5000 then rejects it."""
    from dataclasses import replace

    from planner.disagg_search import queued_at_capacity

    request = ServeRequest(input_len=1024, output_len=256, max_concurrency=20)
    found = plan_disaggregated(resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100"),
                               ServeRequest(input_len=1024, output_len=256)).candidates[0]
    found = replace(found, requests_per_second=2.0, e2e_seconds=5.0, ttft_seconds=1.0)
    queued = queued_at_capacity(request, found, 20)
    assert (queued.ttft_seconds, queued.e2e_seconds) == pytest.approx((6.0, 10.0))
    assert queued.requests_per_second == 2.0 and queued.tpot_seconds == found.tpot_seconds
    assert "Client-bound at capacity: 20 clients a copy" in queued.notes[-1]
    assert queued_at_capacity(request, found, 10) is found
    limited = replace(request, max_ttft_seconds=5.0)
    assert queued_at_capacity(limited, found, 20).startswith("TTFT over the limit with --max-concurrency 20")


def test_a_disaggregated_copy_at_capacity_queues_its_clients_as_the_aggregated_replicas_do(run_plan):
    """Llama-3.1-70B on 8 H100, 8,000/200 tokens, 64 clients: the best disaggregated copy completes
    2.18 req/s at an 8.8 s E2E, 19 in flight; its TTFT showed 5.0 s as if the other 45 clients
    were not there, where the aggregated rows of the same plan queue theirs (found by a CLI read).
    Little's law now holds for the copy: requests/s x E2E = the clients."""
    data = json.loads(run_plan("--model", "llama-3.1-70b", "--cluster", "1x8xH100", "--input-len", "8000",
                               "--output-len", "200", "--max-concurrency", "64", "--json").stdout)
    best = data["disaggregated"][0]
    assert best["copies"] == 1
    assert best["requests_per_second"] * best["e2e_seconds"] == pytest.approx(64, rel=1e-3)
    assert best["ttft_seconds"] > 20


def test_no_worker_fitting_names_the_largest_ones_reason(run_plan):
    """Llama-3.1-70B fp8 on 4 L40S: a 2-GPU worker holds the weights, but its KV cache holds
    fewer tokens than one 131,072-token sequence. "No worker fits in memory on up to 2 GPUs"
    read as the weights not fitting (found by a CLI read); the reason now says which."""
    data = json.loads(run_plan("--model", "llama-3.1-70b", "--cluster", "1x4xL40S", "--quantization", "fp8",
                               "--json").stdout)
    reason = data["comparison"]["reason"]
    assert "no prefill or decode worker fits in memory on up to 2 GPUs" in reason
    assert "the largest, tp=2 pp=1: KV cache holds" in reason and "fewer than one max-length sequence (131,072)" in reason


def test_a_fixed_batch_is_held_by_the_decode_workers_too():
    """--batch 64 with --max-tpot-ms 20 on 8 H100 (Llama-3.1-70B): every aggregated layout misses
    "at concurrency 64", and the decode workers had been sized to 44 sequences under the limit
    without a word (a CLI read). --batch fixes the concurrency in both modes: a decode worker that
    meets the limit only below it is rejected; without --batch it runs what meets it."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.disagg_search import plan_disaggregated

    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100")
    fixed = plan_disaggregated(model, cluster, ServeRequest(batch=64, max_tpot_seconds=0.020))
    assert fixed.recommended is None
    free = plan_disaggregated(model, cluster, ServeRequest(max_tpot_seconds=0.020))
    assert free.recommended is not None and free.recommended.decode.concurrency < 64
    assert any(reason.startswith("--batch 64: the decode worker does not run that many")
               for reason, _ in fixed.rejected)
    # nor below what the KV cache holds: 8,000 / 1,000 tokens leave room for far fewer than 256
    kv_bound = plan_disaggregated(model, cluster, ServeRequest(batch=256, input_len=8000, output_len=1000,
                                                               max_tpot_seconds=0.025))
    assert kv_bound.recommended is None


def test_a_chunked_prompts_binding_prefill_says_its_steps():
    """Llama-3.1-8B on 8 H100 at a 512-token budget, 1,024-token prompts: a prompt takes 2
    steps, and the reason says so (it had read "a step of 1.0 prompts takes 15 ms", a whole
    prompt in one step; found by a CLI sweep)."""
    from planner.disagg_cli import binding_reason

    model, spec = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    request = ServeRequest(input_len=1024, output_len=256, max_num_batched_tokens=512)
    best = plan_disaggregated(model, spec, request).recommended
    assert best.binding == "prefill" and best.steps_per_prompt == 2
    assert binding_reason(best).startswith("the prefill workers bind: a prompt takes 2 steps (its chunks) of ")


@pytest.mark.parametrize("share", [0.95, 1.05])
def test_a_sent_rate_runs_up_to_the_prefill_capacity_not_the_planned_ceiling(share):
    """Without a rate the plan loads prefill workers to MAX_PREFILL_UTILIZATION (0.9) of their
    capacity: Llama-3.1-70B on 2x8 H100, 2,048/256 tokens, P 1x(tp=1 pp=8) + D 1x(tp=8) at
    18.19 req/s, the prefill binding at 0.9 of 20.2. A --request-rate the user sends runs up to
    the capacity itself (rate_bound, rate_capacity_per_second): at 0.95 of it, 19.2 req/s, the
    deployment keeps up (priced at that load, binding request-rate, the note naming the 20.2 it
    can take); at 1.05, 21.2 req/s, it is overloaded, the note and the comparison's clause naming
    20.2 and it is credited with those 20.2 (they had named the planned 18.19, credited it with
    them, and called 19.2 req/s overloaded)."""
    from planner.cost.disaggregated import MAX_PREFILL_UTILIZATION
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    base = plan_disaggregated(model, cluster, ServeRequest(input_len=2048, output_len=256)).recommended
    assert base.binding == "prefill" and base.prefill_load.utilization == pytest.approx(MAX_PREFILL_UTILIZATION)
    capacity = base.requests_per_second / MAX_PREFILL_UTILIZATION
    rate = share * capacity * base.copies
    plan = plan_disaggregated(model, cluster, ServeRequest(input_len=2048, output_len=256, request_rate_per_s=rate,
                                                           num_prompts=300))
    found = next(e for e in plan.candidates if e.label == base.label)
    if share < 1:
        assert not found.overloaded and found.binding == "request-rate"
        assert found.requests_per_second == pytest.approx(rate / found.copies, rel=1e-9)
        assert found.prefill_load.utilization == pytest.approx(share, rel=1e-6)
        assert any(note.startswith("Rate-bound") and f"of the {capacity:.1f} one can take" in note
                   for note in found.notes)
    else:  # credited with what it completes, its capacity (as an overloaded aggregated layout)
        assert found.overloaded and found.rate_shortfall == f"at most {capacity:.1f} req/s per copy"
        assert found.requests_per_second == pytest.approx(capacity, rel=1e-9)
        assert any(note.startswith("Overloaded") and f"completes at most {capacity:.1f} req/s" in note
                   for note in found.notes)


def test_a_pipelined_binding_prefill_counts_its_micro_batches():
    """The same 70B deployment's reason: its pp = 8 prefill worker runs a round of 8 micro-batches
    of b prompts in T, so it takes up to 8 b / T prompts a second (b = max(1, r T(b) / k), what
    arrives during a round: here 0.95, so a round of 1 prompt a micro-batch, 418 ms, with room to
    spare), and it runs at the 90% ceiling the plan loads prefill workers to, not held there by
    a TTFT limit (it had read "a step of b prompts takes T", 8 times too few; a CLI read)."""
    from planner.disagg_cli import binding_reason

    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    best = plan_disaggregated(model, cluster, ServeRequest(input_len=2048, output_len=256)).recommended
    p = best.prefill
    assert best.binding == "prefill" and p.pp == 8 and p.workers == 1 and best.steps_per_prompt == 1
    reason = binding_reason(best)
    assert reason.startswith(f"the prefill workers bind: a round of 8 micro-batches of {p.concurrency:.1f} prompts "
                             f"takes {p.round_seconds * 1000:.0f} ms")
    assert reason.endswith("90% of their capacity (the most the plan loads them to)")
    assert p.concurrency == 1.0
    assert best.requests_per_second == pytest.approx(0.95 * 8 / p.round_seconds, rel=0.01)


def test_a_sent_rate_keeps_the_decode_cap_an_e2e_limit_refined():
    """Llama-3.1-70B on 2x8 H100 under --max-e2e-ms 3000 at 2.1 req/s: the E2E limit lowers each
    pairing's decode cap (_largest_meeting_e2e: 6 sequences on tp=8), and the rate's pricing and
    the copy's capacity take that cap, not the one that missed the limit (a review: "2.1 req/s
    of the 24.4 one can take" at the unrefined cap, launched with --max-num-seqs 128): at 6 the
    decode worker finishes 2.06 req/s, below the rate, so the copy falls behind it, and under an
    E2E limit one behind the rate is rejected (its queue is in E2E: rate_bound). Without the
    limit the same rate is kept up with, at the caps the limit did not lower."""
    import planner.disagg_search as ds

    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    request = ServeRequest(max_e2e_seconds=3.0, request_rate_per_s=2.1, num_prompts=300)
    plan = plan_disaggregated(model, cluster, request)
    assert not plan.candidates and dict(plan.rejected).get(ds.rate_overload_miss(request), 0) > 0
    free = plan_disaggregated(model, cluster, ServeRequest(request_rate_per_s=2.1, num_prompts=300))
    assert free.recommended is not None and not free.recommended.overloaded
    assert free.recommended.decode.max_num_seqs > 6


QWEN_TTFT = ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=0.5)


def test_a_looser_tpot_limit_never_lowers_disaggregated_goodput_under_a_ttft_limit():
    """Qwen3-235B fp8 on 2x8 H200 at TTFT 500 ms: the first token waits for a decode round at the
    cap, so the halvings of the TPOT limit's cap (decode_caps) landed on either side of the cap
    where prefill and decode take the same rate, and 133.9 ms priced 1,121 tok/s per GPU where
    95.1 ms had 1,127. Each count pair is now also priced where the two sides cross
    (crossing_key)."""
    model, cluster = resolve_model("qwen3-235b-a22b-fp8"), resolve_cluster("2x8xH200")
    tpot_ms = (60.0, 95.1, 133.9, 200.0)
    goodputs = [plan_disaggregated(model, cluster, replace(QWEN_TTFT, max_tpot_seconds=t / 1000)).recommended
                .plan_goodput_per_gpu for t in tpot_ms]
    assert goodputs == sorted(goodputs), goodputs


def test_the_decode_cap_sits_where_prefill_and_decode_rates_cross():
    """The recommended deployment's decode ranks are loaded to where the two sides' rates cross,
    between two whole caps (balanced_key): launched at c and loaded to x in (c - 1, c). The same
    deployment at a fixed --batch of c - 1 (the one concurrency then tried) lets the decode side
    bind lower, and at c leaves the prefill the TTFT budget of a round at c (it binds): neither
    completes as many requests."""
    model, cluster = resolve_model("qwen3-235b-a22b-fp8"), resolve_cluster("2x8xH200")
    request = replace(QWEN_TTFT, max_tpot_seconds=0.1339)
    best = plan_disaggregated(model, cluster, request).recommended
    cap = best.decode.max_num_seqs
    assert best.ttft_seconds <= 0.5 * (1 + 1e-9) and cap - 1 < best.decode.concurrency < cap
    for other, binding in ((cap - 1, "decode"), (cap, "prefill")):
        same = [e for e in plan_disaggregated(model, cluster, replace(request, batch=other)).candidates
                if e.label == best.label and e.same_node == best.same_node]
        assert same and same[0].requests_per_second < best.requests_per_second, (other, same)
        assert same[0].binding == binding


def test_a_goodput_tie_goes_to_the_much_shorter_requests():
    """Qwen3-235B fp8 on 2x8 H200, TTFT 500 ms, TPOT 134 ms: the aggregated tp=4 dp=4 serves
    1,134 output tok/s per GPU at 611 sequences a replica (TPOT near the limit, E2E 34.5 s), the
    disaggregated deployment 1,129 (a tie within 3%) at E2E 9.5 s: 3.6 times shorter requests for
    the same tokens/s per GPU, at least TIE_LATENCY_FACTOR (1.5), so it is recommended; below
    that factor the simpler aggregated layout keeps the tie."""
    from planner.disagg_cli import compare
    from planner.serve_search import TIE_LATENCY_FACTOR

    model, cluster = resolve_model("qwen3-235b-a22b-fp8"), resolve_cluster("2x8xH200")
    request = ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=0.5, max_tpot_seconds=0.134)
    aggregated = plan_serving(model, cluster, request).recommended
    _, verdict = plan_both(model, cluster, request, aggregated)
    disagg = plan_disaggregated(model, cluster, request).recommended
    a, d = aggregated.goodput_per_planned_gpu(disagg.plan_gpus), disagg.plan_goodput_per_gpu
    assert d < a <= d * 1.03 and aggregated.e2e_seconds / disagg.e2e_seconds > 3
    assert verdict.winner == "disaggregated" and "a tie within 3%, and E2E latency" in verdict.reason
    # the same tie with the aggregated requests just under the factor: the simpler one is kept
    near = SimpleNamespace(**{k: getattr(aggregated, k) for k in ("offered_rate_per_s", "overloaded", "layout",
                                                                  "ttft_seconds", "tpot_seconds")},
                           e2e_seconds=0.99 * TIE_LATENCY_FACTOR * disagg.e2e_seconds,
                           goodput_per_planned_gpu=lambda _gpus: a)
    kept = compare(near, disagg, "")
    assert kept.winner == "aggregated" and "so the simpler deployment" in kept.reason


@pytest.mark.parametrize("model_name, cluster_name, input_len, ttft_ms, tpot_ms", [
    ("qwen3-235b-a22b-fp8", "2x8xH200", 1024, 150, (100, 105, 110, 120)),
    ("llama-3.1-8b", "1x8xH100", 4096, 200, (60, 80, 100, 130, 200)),
])
def test_looser_tpot_limits_at_tight_ttft_limits_never_lower_the_goodput(model_name, cluster_name, input_len,
                                                                          ttft_ms, tpot_ms):
    """Two cases a sweep found falling as the TPOT limit loosened: Qwen3-235B fp8 at TTFT 150 ms
    (372.9 -> 368.7 tok/s per GPU from 100 to 105 ms, when the crossing was sought only for the
    deployments already ranked by their halvings' bounds), Llama-3.1-8B at 4,096-token prompts and
    TTFT 200 ms (883.2 -> 879.1 from 80 to 100 ms, the halvings alone)."""
    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    goodputs = [plan_disaggregated(model, cluster, ServeRequest(input_len=input_len, output_len=256,
                                                                max_ttft_seconds=ttft_ms / 1000,
                                                                max_tpot_seconds=t / 1000)).recommended
                .plan_goodput_per_gpu for t in tpot_ms]
    assert goodputs == sorted(goodputs), goodputs


@pytest.mark.parametrize("args", [
    ("--model", "deepseek-v3", "--cluster", "2x8xH200", "--max-ttft-ms", "150", "--max-tpot-ms", "40"),
    ("--model", "mixtral-8x7b", "--cluster", "1x8xH100", "--input-len", "4096", "--output-len", "512",
     "--max-ttft-ms", "150", "--max-tpot-ms", "20"),
])
def test_a_crossing_cap_without_a_ttft_budget_is_skipped(run_plan, args):
    """A review's crash: the cap above the crossing can leave the prefill no TTFT budget
    (_pairing's reason, a string), which was priced as if it were rates (ValueError). DeepSeek-V3
    with P tp=4 pp=2 and D dp=8 ep=8 (top cap 13); Mixtral at 4,096-token prompts."""
    result = run_plan(*args, "--mode", "disaggregated")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "goodput/GPU" in result.stdout


def never_falls(goodputs: list[float]) -> bool:
    """Each goodput at least the one before, within the E2E-limited rate's solver tolerance
    (disagg_search.E2E_RATE_TOLERANCE: the same deployment's rate found from another bracket)."""
    from planner.disagg_search import E2E_RATE_TOLERANCE

    return all(b >= a * (1 - 2 * E2E_RATE_TOLERANCE) for a, b in itertools.pairwise(goodputs))


@pytest.mark.parametrize("model_name, cluster_name, input_len, limits, tpot_ms", [
    ("qwen3-235b-a22b-fp8", "2x8xH200", 1024, dict(max_e2e_seconds=8.0, max_ttft_seconds=0.8), (45, 60, 80, 150)),
    ("deepseek-v3", "4x8xH200", 1024, dict(max_e2e_seconds=10.0, max_ttft_seconds=1.0), (40, 60, 80)),
    ("qwen3-235b-a22b-fp8", "2x8xH200", 4096, dict(max_e2e_seconds=3.0, max_ttft_seconds=0.3), (50, 60)),
    ("mixtral-8x7b", "2x8xA100", 4096, dict(max_e2e_seconds=1.5, max_ttft_seconds=0.3), (20, 30)),
    ("llama-3.1-70b", "2x8xH100", 1024, dict(max_e2e_seconds=3.0, max_ttft_seconds=0.3), (45, 60)),
    # a decode round that dipped as its mean load rose (round(M) in the GEMMs' u(M)) had stopped
    # the E2E bisection at a first crossing: 52.63 at TPOT 30 ms, 47.15 at 45 (a second review)
    ("qwen3-235b-a22b-fp8", "2x8xH200", 1024, dict(max_e2e_seconds=3.0, max_ttft_seconds=0.3), (30, 45)),
])
def test_looser_tpot_limits_under_an_e2e_limit_never_lower_the_goodput(model_name, cluster_name, input_len, limits,
                                                                        tpot_ms):
    """With an E2E limit the cap a count pair is priced at is the one up to its crossing, or
    above it, that meets E2E with the most requests/s (crossing_key), and a combination that
    misses E2E at its matched rate runs at the most that meets it (e2e_limited): the halvings and
    quarters alone priced Qwen3-235B fp8 at E2E 8 s, TTFT 800 ms 896.3 tok/s per GPU at TPOT
    45-60 ms and 838.7 at 80, DeepSeek-V3 at E2E 10 s 581.1 then 565.4 (a review and a sweep);
    the crossing sought below it alone, Qwen3-235B at 4,096-token prompts and E2E 3 s 30.4 at TPOT
    50 ms and 28.8 at 60 (caps 127-134 above the crossing met E2E at 1.90 req/s, the one below at
    1.54), Mixtral 15.5 then 13.9 (a review)."""
    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    goodputs = [plan_disaggregated(model, cluster, ServeRequest(input_len=input_len, output_len=256,
                                                                max_tpot_seconds=t / 1000, **limits)).recommended
                .plan_goodput_per_gpu for t in tpot_ms]
    assert never_falls(goodputs), goodputs


@pytest.mark.parametrize("model_name, cluster_name, limits, ttft_ms", [
    ("mixtral-8x7b", "2x8xA100", dict(max_e2e_seconds=1.5), (200, 300)),
    ("deepseek-v3", "4x8xH200", dict(max_e2e_seconds=3.0, max_tpot_seconds=0.08), (200, 300)),
    ("deepseek-v3", "4x8xH200", dict(max_e2e_seconds=3.0, max_tpot_seconds=0.02), (200, 300)),
])
def test_looser_ttft_limits_under_an_e2e_limit_never_lower_the_goodput(model_name, cluster_name, limits, ttft_ms):
    """A looser TTFT limit raises a pairing's matched rate (more prefill budget), where E2E can
    miss; it had been priced there or not at all: Mixtral-8x7B on 2x8 A100 at E2E 1.5 s, 17.0 ->
    14.0 tok/s per GPU from TTFT 200 to 300 ms, DeepSeek-V3 46.4 -> 43.5 (a review). A
    combination that misses E2E at its matched rate now runs at the most that meets it
    (e2e_limited), as the aggregated SLA search loads a layout. Its first version dropped such a
    combination where the same deployment had been refined to a lower cap below it (`seen`):
    DeepSeek-V3 at TPOT 20 ms 45.85 -> 43.45, 48.10 now at both (a second review)."""
    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    found = [plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256,
                                                             max_ttft_seconds=t / 1000, **limits)).recommended
             for t in ttft_ms]
    assert all(e.e2e_seconds <= limits["max_e2e_seconds"] * (1 + 1e-9) for e in found)
    assert never_falls([e.plan_goodput_per_gpu for e in found]), [e.plan_goodput_per_gpu for e in found]


def test_a_combination_missing_e2e_at_its_matched_rate_runs_at_the_most_that_meets_it():
    """Hand-checkable shape of e2e_limited: the deployment's E2E at the rate it is loaded to is the
    limit (to the solver's tolerance), below its matched rate, where E2E is over; its binding and
    note say so, and the decode workers run the Little's-law concurrency of that rate."""
    request = ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=0.3, max_e2e_seconds=1.5)
    best = plan_disaggregated(resolve_model("mixtral-8x7b"), resolve_cluster("2x8xA100"), request).recommended
    assert best.binding == "e2e"
    assert best.e2e_seconds <= 1.5 and best.e2e_seconds == pytest.approx(1.5, rel=1e-3)
    assert best.requests_per_second < min(best.rate.prefill_requests_per_second, best.rate.decode_requests_per_second)
    note = next(n for n in best.notes if n.startswith("E2E-bound"))
    assert "over --max-e2e-ms 1500" in note
    # Little's law on a decode rank: C_d = R x O x T_d (one worker, one rank)
    assert best.decode.concurrency == pytest.approx(best.requests_per_second * 256 * best.tpot_seconds, rel=1e-3)


def test_a_count_pair_every_halving_of_whose_cap_misses_the_ttft_budget_is_still_sought():
    """Qwen3-235B fp8 on 2x8 H200 at TTFT 100 ms: at TPOT 40 ms a P tp=8 + D tp=8 deployment runs
    29 sequences (101.3 tok/s per GPU, TTFT 99.9 ms); at TPOT 50 ms every halving of the larger
    cap stayed above 29, left the prefill no TTFT budget, and the search found nothing (a
    review). Its crossing is sought from every count pair now, priced or not."""
    model, cluster = resolve_model("qwen3-235b-a22b-fp8"), resolve_cluster("2x8xH200")
    found = [plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=0.1,
                                                             max_tpot_seconds=t)).recommended for t in (0.04, 0.05)]
    assert all(e is not None and e.ttft_seconds <= 0.1 for e in found)
    assert found[1].plan_goodput_per_gpu >= found[0].plan_goodput_per_gpu > 100


def test_an_impossible_ttft_or_e2e_limit_says_what_would_fit(run_plan):
    """--mode disaggregated with a TTFT or E2E limit no pairing meets even with one request
    alone said only "none meets the SLA" (the aggregated plan says what would fit): it names the
    least limit one pairing meets (lowest_latencies: the lone request's TTFT = first-token cost
    + its prefill + the KV transfer + a decode round, E2E adding a round per further token), and
    at that limit the search finds a deployment."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    plan = plan_disaggregated(model, cluster, ServeRequest(max_ttft_seconds=0.005))
    assert plan.recommended is None and len(plan.would_fit) == 1
    line = plan.would_fit[0]
    assert line.startswith("--max-ttft-ms ") and "with one request alone" in line
    least_ms = int(line.split()[1].replace(",", ""))
    assert plan_disaggregated(model, cluster, ServeRequest(max_ttft_seconds=least_ms / 1000)).recommended is not None
    assert plan_disaggregated(model, cluster, ServeRequest(max_ttft_seconds=(least_ms - 2) / 1000)).recommended is None
    e2e = plan_disaggregated(model, cluster, ServeRequest(max_e2e_seconds=0.5))
    assert [w.split()[0] for w in e2e.would_fit] == ["--max-e2e-ms"]
    # a limit some pairing meets alone says nothing of the kind
    assert plan_disaggregated(model, cluster, ServeRequest(max_ttft_seconds=1.0)).would_fit == ()
    result = run_plan("--model", "llama-3.1-70b", "--cluster", "2x8xH100", "--mode", "disaggregated",
                      "--max-ttft-ms", "5", "--json")
    document = json.loads(result.stdout)
    assert document["disaggregated"] == [] and document["disaggregated_why_none"] == "none meets the SLA"
    assert document["disaggregated_would_fit"] == list(plan.would_fit)


def test_tpot_load_cap_by_hand(monkeypatch):
    """A decode rank whose round is T(C) = 4 ms + 1 ms x C meets --max-tpot-ms 5.5 at 1 whole
    sequence (5 ms; 2 take 6 ms): launched at 2 and handed no more than C* on average, where
    4 + C* = 5.5, it runs C* = 1.5 within the limit. None where the engine cannot run the one
    more (its cap is the TPOT cap), and where C* gains under TPOT_LOAD_MIN_GAIN (5.005 ms: 1.005)."""
    import planner.disagg_search as ds

    monkeypatch.setattr(ds, "decode_rounds", lambda *args: lambda c: 0.004 + 0.001 * c)
    request = ServeRequest(max_tpot_seconds=0.0055)
    assert ds.tpot_load_cap(None, None, request, None, None, 1, 10) == pytest.approx(1.5, abs=1e-5)
    assert ds.tpot_load_cap(None, None, request, None, None, 1, 1) is None
    assert ds.tpot_load_cap(None, None, replace(request, max_tpot_seconds=0.005005), None, None, 1, 10) is None
    assert ds.tpot_load_cap(None, None, replace(request, max_tpot_seconds=0.0065), None, None, 2, 10) == \
        pytest.approx(2.5, abs=1e-5)


def test_a_tpot_bound_decode_rank_runs_the_fraction_of_one_more_sequence():
    """Mixtral-8x7B on 2x8 A100 at TPOT 5 ms: a lone sequence's round is 4.5 ms and two take
    5.86, so the whole cap was 1 sequence (14.0 tok/s per GPU). Launched at --max-num-seqs 2 and
    loaded to C* = 1.38 on average (its round then exactly 5 ms) the deployment serves 17.3; the
    note says what a burst filling both slots costs. Little's law holds on the rank."""
    model, cluster = resolve_model("mixtral-8x7b"), resolve_cluster("2x8xA100")
    best = plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=0.3,
                                                           max_tpot_seconds=0.005)).recommended
    assert best.decode.max_num_seqs == 2 and best.tpot_seconds <= 0.005
    assert best.tpot_seconds == pytest.approx(0.005, rel=1e-4)
    assert best.plan_goodput_per_gpu == pytest.approx(17.29, abs=0.01) and best.plan_goodput_per_gpu > 14.0
    assert any(n.startswith("TPOT-bound: each decode rank is launched at --max-num-seqs 2") for n in best.notes)
    # the table's C_d is the load to a tenth, and the launch-cap note (a burst's "room") gives way to the TPOT-bound one
    from planner.render.disagg import launch_cap_notes
    from planner.units import sequences

    assert sequences(best.decode.concurrency) == "1.4" and launch_cap_notes(best) == []
    assert best.decode.concurrency == pytest.approx(best.requests_per_second * 256 * best.tpot_seconds
                                                    / best.decode.workers, rel=1e-3)


@pytest.mark.parametrize(("model_name", "cluster_name"), [("mixtral-8x7b", "2x8xA100"),
                                                          ("qwen3-30b-a3b", "2x8xH200")])
def test_tight_tpot_limits_are_met_and_looser_ones_never_lower_the_goodput(model_name, cluster_name):
    """TPOT limits from about one sequence's round up: every candidate meets its limit, and the
    goodput rises with the limit (the fraction of one more sequence, tpot_load_cap, made it rise
    smoothly where it stepped: Qwen3-30B-A3B at 5 ms 186 -> 239 tok/s per GPU)."""
    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    previous = 0.0
    for tpot in (0.004, 0.005, 0.006, 0.007, 0.008, 0.010):
        plan = plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=0.3,
                                                               max_tpot_seconds=tpot))
        assert all(e.tpot_seconds <= tpot * (1 + 1e-12) for e in plan.candidates)
        goodput = plan.recommended.plan_goodput_per_gpu if plan.recommended else 0.0
        assert goodput >= previous * (1 - 1e-9), (tpot, goodput, previous)
        previous = goodput


def test_tpot_is_checked_at_the_load_the_decode_ranks_run():
    """A decode round need not grow with the load: vLLM fuses each TP all-reduce with the next
    RMSNorm up to 512 KiB at tp 8 on H100 (32 rows of Llama-3.1-70B's 8,192 x 2 bytes), and the
    fused kernel is priced slower than the unfused one above it, so T_d(32) = 15.49 ms exceeds
    T_d(35) = 15.22 ms. Checked at the cap alone, a deployment whose prefill binds ran its decode
    ranks at 30.7 sequences, 15.32 ms, past --max-tpot-ms 15.225 (a review); now every candidate
    meets the limit at its own load."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    plan = plan_disaggregated(model, cluster, ServeRequest(input_len=4096, output_len=256, max_tpot_seconds=0.015225))
    assert plan.candidates and all(e.tpot_seconds <= 0.015225 * (1 + 1e-9) for e in plan.candidates)


def test_balanced_key_by_hand(monkeypatch):
    """One prefill and one decode worker whose rates per worker are r_p(x) = 10.5 - x and r_d(x)
    = x req/s with the decode ranks at x sequences: the decode side binds at 5 whole sequences
    (5 < 5.5) and the prefill side at 6 (4.5 < 6), so the sides cross at x = 5.25 (10.5 - 5.25 =
    5.25), between the whole caps. The key found launches the ranks at the whole cap above, 6,
    and loads them to 5.25 within the bisection's 1/4,096 of a sequence, where a copy completes
    5.25 req/s (5 and 4.5 at the whole caps)."""
    import types

    import planner.disagg_search as ds

    monkeypatch.setattr(ds, "pairing_rates", lambda model, cluster, request, memo, p_key, shape, x, same:
                        (10.5 - x, x))
    memo, shape = ds._Memo(), types.SimpleNamespace(key=(1, 1, 1))
    key, rate = ds.balanced_key(None, None, None, memo, ("p",), shape, 1, 1, True, 5, 10)
    assert memo.decode[key] == 6 and memo.load_cap[key] == pytest.approx(5.25, abs=2.0**-12)
    assert key in memo.balanced and rate == pytest.approx(5.25, abs=2.0**-12)
    # the decode side binds at both whole caps 4 and 5: no crossing between them
    assert ds.balanced_key(None, None, None, memo, ("p",), shape, 1, 1, True, 4, 10) is None
    # at the TPOT limit's cap 5, only up to its fractional load (tpot_load_cap): at 5.2 the decode side still binds
    memo.load_cap[ds._cap_key(memo, shape, 6)] = 5.2
    assert ds.balanced_key(None, None, None, memo, ("p",), shape, 1, 1, True, 5, 5) is None
    memo.load_cap[ds._cap_key(memo, shape, 6)] = 5.5
    key, rate = ds.balanced_key(None, None, None, memo, ("p",), shape, 1, 1, True, 5, 5)
    assert memo.decode[key] == 6 and rate == pytest.approx(5.25, abs=2.0**-12)


def test_a_looser_tpot_limit_keeps_the_crossing_where_the_prefill_binds():
    """helper-154: Qwen3-235B fp8 on 2x8 H200, 1,024-token prompts at TTFT 150 ms. At TPOT 18.7
    ms the decode ranks (tp 2, three workers) were launched at 7 and loaded to 6.82; at 19.0 the
    whole cap became 7, the prefill's TTFT budget was priced at a round of 7 sequences while the
    prefill kept the ranks at 6.49, and goodput fell from 135.8 to 133.3 tok/s per GPU. The ranks
    are now loaded to where the two sides' rates cross (about 6.78 sequences), at either limit."""
    model, cluster = resolve_model("qwen3-235b-a22b-fp8"), resolve_cluster("2x8xH200")
    found = [plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=0.15,
                                                             max_tpot_seconds=t)).recommended for t in (0.018704, 0.019)]
    assert all(e.ttft_seconds <= 0.15 * (1 + 1e-9) for e in found)
    assert found[1].plan_goodput_per_gpu >= found[0].plan_goodput_per_gpu * (1 - 1e-9)
    assert found[0].plan_goodput_per_gpu > 135.84
    assert found[1].decode.max_num_seqs == 7 and 6.5 < found[1].decode.concurrency < 7


def test_a_round_over_the_tpot_limit_prints_above_it():
    """The TPOT-bound note's full round: 5.001 ms beside --max-tpot-ms 5 printed as 5.00; it
    takes as many decimals as show it over the limit (5.86 at two)."""
    from planner.units import ms_above

    # the note's digits: two, up to six
    assert ms_above(0.005001, 0.005, 2, 6) == "5.001" and ms_above(0.00586, 0.005, 2, 6) == "5.86"
    assert ms_above(0.0050000004, 0.005, 2, 6) == "5.000000"


def test_clients_rate_bound_by_hand():
    """10 clients over 4 copies: 2 copies hold 3 and 2 hold 2 (10 = 2 x 4 + 2). With an E2E of at
    least 0.5 s a copy of 3 clients completes at most 3 / 0.5 = 6 req/s and one of 2 at most 4;
    at a capacity of 5 req/s a copy: 2 x min(5, 6) + 2 x min(5, 4) = 10 + 8 = 18 req/s. More
    copies than clients leave some idle: 2 clients over 4 copies, 2 x min(5, 2) = 4. With E2E(R)
    = 2 s + 0.1 s x R, capacity 10 and 8 clients on one copy (the fixed point 3.4164 req/s,
    closed_loop_rate's worked case): g(0) = 8 / 2 = 4, g(4) = 8 / 2.4 = 3.3333, g(3.3333) = 8 /
    2.3333 = 3.4286, above the fixed point and below g(0)."""
    from planner.disagg_search import clients_rate_bound

    assert clients_rate_bound(10, 4, 5.0, lambda _rate: 0.5, 0) == pytest.approx(18.0)
    assert clients_rate_bound(2, 4, 5.0, lambda _rate: 0.5) == pytest.approx(4.0)
    bound = clients_rate_bound(8, 1, 10.0, lambda rate: 2.0 + 0.1 * rate)
    assert bound == pytest.approx(8 / (2 + 0.1 * 8 / 2.4), rel=1e-12) and 3.4164 < bound < 4


def test_a_looser_tpot_limit_never_lowers_a_client_bound_goodput():
    """Llama-3.1-8B on 1x8 H100 at --max-concurrency 4: 142.6 tok/s per GPU at TPOT 6.5 ms fell to
    106.1 at 7.3 ms and stayed there (a review sweep): the search priced the rows with the most
    capacity, which four clients cannot fill, and stopped. It orders them by what the clients
    can keep them at (clients_rate_bound) now."""
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    found = [plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256, max_concurrency=4,
                                                             max_tpot_seconds=t)).recommended
             for t in (0.0065, 0.0073, 0.02)]
    assert found[0].plan_goodput_per_gpu > 140
    # (to the Little's-law solve's tolerance: the same deployment at caps 105 and 130)
    assert found[1].plan_goodput_per_gpu >= found[0].plan_goodput_per_gpu * (1 - 1e-5)
    assert found[2].plan_goodput_per_gpu >= found[1].plan_goodput_per_gpu * (1 - 1e-5)


def test_clients_are_checked_against_the_limits_at_their_own_load():
    """Qwen3-235B fp8 on 2x8 H200 at 64 clients and --max-e2e-ms 5500 (a review): a deployment
    that misses E2E at its matched rate was only refined to a lower decode cap, where the 64
    clients queued, and once the refinements went to other pairings the search found nothing
    (187.0 tok/s per GPU before the clients' order). Under --max-concurrency a combination that
    misses TTFT or E2E at its matched rate is priced at its clients' load, where the limits are
    checked (client_bound): 190.2 at E2E 5.38 s."""
    model, cluster = resolve_model("qwen3-235b-a22b-fp8"), resolve_cluster("2x8xH200")
    plan = plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256, max_concurrency=64,
                                                           max_e2e_seconds=5.5))
    best = plan.recommended
    assert best is not None and best.binding == "clients" and best.plan_goodput_per_gpu > 187.0
    assert all(e.e2e_seconds <= 5.5 * (1 + 1e-9) for e in plan.candidates)
    # Little's law on the busiest copy: its clients over its rate is its E2E
    assert best.requests_per_second * best.e2e_seconds == pytest.approx(64 / best.copies, rel=1e-3)


def test_with_a_ttft_limit_the_clients_find_the_deployment_a_lower_cap_found():
    """The clients' order bounds only a deployment's highest decode cap (a lower one runs the same
    concurrency below its capacity). When the prefill's TTFT budget was priced with the round at the
    cap, a lower cap left it more, and bounding the highest alone took Llama-3.1-70B on 2x8 H100
    at 64 clients and TTFT 300 ms from 261.5 to 205.2 tok/s per GPU (a sweep); under clients the
    budget is priced with a lone sequence's round, the same at every cap (pairing_rates)."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    best = plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256, max_concurrency=64,
                                                           max_ttft_seconds=0.3)).recommended
    assert best is not None and best.ttft_seconds <= 0.3 * (1 + 1e-9)
    assert best.plan_goodput_per_gpu == pytest.approx(261.5, abs=0.1)


def test_a_ttft_limit_the_clients_meet_keeps_the_deployment_they_run():
    """Under --max-concurrency the first token waits for a decode round at the sequences the
    clients keep in flight, not at the decode cap. Llama-3.1-8B on 1x8 H100, 64 clients: 1,499.2
    tok/s per GPU at TTFT 43.07 ms without a limit; at --max-ttft-ms 44 the prefill's budget,
    priced with the round at the cap (128 sequences, 7.21 ms), capped the deployment at 42.62 req/s
    where the clients keep 46.85 at some 62 sequences, so the clients "queued" and nothing was
    found (a review; Qwen3-30B-A3B at 16 clients and TTFT 77 ms found 198.6 for 201.5). Priced with
    a lone sequence's round and checked at the clients' load, the limit keeps the no-limit answer."""
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    free = plan_disaggregated(model, cluster, ServeRequest(max_concurrency=64)).recommended
    limited = plan_disaggregated(model, cluster, ServeRequest(max_concurrency=64, max_ttft_seconds=0.044)).recommended
    assert free is not None and free.ttft_seconds < 0.044
    assert limited is not None and limited.ttft_seconds <= 0.044
    assert limited.plan_goodput_per_gpu == pytest.approx(free.plan_goodput_per_gpu, rel=1e-5)


def test_the_busiest_copys_clients_queue_when_only_it_is_full():
    """141 clients on two copies of Llama-3.1-70B (P tp=1 + D tp=4 on 2x8 A100): 71 on one, 70
    on the other. At 142 (71 each) both copies run at capacity R and a request takes 71 / R (Little's
    law, the clients beyond what a copy holds queueing for its prefill); at 141 the busiest copy
    is as full, so its E2E is the same 71 / R. It had been priced at capacity without the queue
    (E2E 11.56 s for 11.64; a review)."""
    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xA100")

    def two_copies(clients: int):
        plan = plan_disaggregated(model, cluster, ServeRequest(max_concurrency=clients), shown=10)
        return next(e for e in plan.candidates if e.copies == 2 and e.prefill.tp == 1 and e.decode.tp == 4)

    full, busiest = two_copies(142), two_copies(141)
    assert full.requests_per_second * full.e2e_seconds == pytest.approx(71, rel=1e-6)
    assert busiest.e2e_seconds == pytest.approx(full.e2e_seconds, rel=1e-6)
    assert busiest.requests_per_second < full.requests_per_second


def test_a_tpot_limit_the_clients_meet_keeps_the_deployment_they_run():
    """Llama-3.1-8B on 1x8 H100 at 64 clients: TPOT 5.188 ms without a limit. At --max-tpot-ms
    5.19 a decode rank may run 62.2 sequences on average; the fraction (0.3% over 62) fell under
    the 1% a fractional load must gain to be priced, so the rank was capped at 62 whole, below the
    clients' load: 1,495.8 tok/s per GPU for 1,499.2 (a review). Under clients every fraction is
    kept (the clients' order bounds only the highest cap, so it costs no extra pricing)."""
    model, cluster = resolve_model("llama-3.1-8b"), resolve_cluster("1x8xH100")
    free = plan_disaggregated(model, cluster, ServeRequest(max_concurrency=64)).recommended
    assert free is not None and free.tpot_seconds < 0.00519
    limited = plan_disaggregated(model, cluster, ServeRequest(max_concurrency=64, max_tpot_seconds=0.00519)).recommended
    assert limited is not None and limited.tpot_seconds <= 0.00519
    assert limited.plan_goodput_per_gpu == pytest.approx(free.plan_goodput_per_gpu, rel=1e-5)


def test_no_more_sequences_decode_than_there_are_clients():
    """Qwen3-235B fp8 on 2x8 H200 at 64 clients: P tp=8 + D tp=8's decode round shortens past 64
    sequences (21.61 ms at 64, 20.85 at 64.5), so Little's law had a second root above the clients,
    11.79 req/s at 64.0 sequences decoding (with the prompts in prefill, 65.4 in flight of 64), and
    the closed loop took it where its bracket held it: 188.7 tok/s per GPU, and a TTFT limit that
    row met found nothing (a review). Decoding is capped at the clients: every row decodes at most
    64 sequences over its decode ranks."""
    model, cluster = resolve_model("qwen3-235b-a22b-fp8"), resolve_cluster("2x8xH200")
    plan = plan_disaggregated(model, cluster, ServeRequest(max_concurrency=64), shown=20)
    assert plan.candidates
    for e in plan.candidates:
        assert e.decode.concurrency * e.decode.workers * e.decode.dp <= 64 * (1 + 1e-9)
        assert e.requests_per_second * e.e2e_seconds <= 64 / e.copies * (1 + 1e-3)


def test_no_more_sequences_decode_than_a_copy_has_clients(monkeypatch):
    """The same with several copies: a copy's decode ranks are capped at its own clients (256
    over 2 copies: 128, over their ranks), not at all 256 (which left Little's law's root above a
    copy's clients within the cap). Every solve _loaded_latency runs is checked for its cap."""
    import planner.disagg_search as ds

    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("2x8xH100")
    request = ServeRequest(max_concurrency=256, output_len=512)
    caps: list[tuple[float, float]] = []  # (the cap handed to the solve, the copy's clients over its ranks)
    solve, priced = ds.decode_concurrency_at_rate, ds._loaded_latency_at
    allowed: list[float] = []

    def at(model_, cluster_, request_, memo, p_key, n_p, d_key, n_d, same, rate, clients):
        copies = ds.combination_copies(cluster_, request_, memo, p_key, n_p, d_key, n_d, same)[1]
        busiest = -(-request_.max_concurrency // copies)
        allowed.append(min(busiest, clients) / (n_d * memo.shapes[d_key].dp))
        try:
            return priced(model_, cluster_, request_, memo, p_key, n_p, d_key, n_d, same, rate, clients)
        finally:
            allowed.pop()

    def recorded(rate, output_len, round_seconds, most):
        if allowed:  # a solve of _loaded_latency's (others price a worker alone)
            caps.append((most, allowed[-1]))
        return solve(rate, output_len, round_seconds, most)

    monkeypatch.setattr(ds, "_loaded_latency_at", at)
    monkeypatch.setattr(ds, "decode_concurrency_at_rate", recorded)
    plan = ds.plan_disaggregated(model, cluster, request, shown=20)
    assert any(e.copies > 1 for e in plan.candidates)
    assert caps and all(most <= bound * (1 + 1e-12) for most, bound in caps)
    for e in plan.candidates:
        busiest = -(-256 // e.copies)
        assert e.requests_per_second * e.e2e_seconds <= busiest * (1 + 1e-3)


def test_a_ttft_limit_at_a_rate_rejects_what_falls_behind_it():
    """Llama-3.1-70B on 8 H100 at 30 req/s: no deployment keeps up; without limits the one that
    serves the most is shown overloaded, credited with its capacity (as an aggregated layout).
    Under --max-ttft-ms (however loose: 5 s) one behind the rate queues for as long as requests
    keep coming, in TTFT too, so it is rejected (ds.rate_overload_miss), as the aggregated
    layouts are (serve.overload_rejection); it had been recommended within the limit."""
    import planner.disagg_search as ds

    model, cluster = resolve_model("llama-3.1-70b"), resolve_cluster("1x8xH100")
    free = plan_disaggregated(model, cluster, ServeRequest(request_rate_per_s=30))
    assert free.candidates and all(e.overloaded for e in free.candidates)
    limited_request = ServeRequest(request_rate_per_s=30, max_ttft_seconds=5.0)
    limited = plan_disaggregated(model, cluster, limited_request)
    assert not limited.candidates
    reason = ds.rate_overload_miss(limited_request)
    assert reason.endswith("so no --max-ttft-ms holds at that rate")
    assert dict(limited.rejected).get(reason, 0) >= len(free.candidates)
