"""`plan explain --mode disaggregated` (issue 13, item 5): the P/D placement and a request's
path, read from the estimate: every number equals the `plan --mode disaggregated --json`
entry's, the path's legs add up to TTFT and E2E, every GPU holds at most one worker."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner.catalog import resolve_cluster, resolve_model
from planner.cli import app
from planner.disagg_search import plan_disaggregated
from planner.explain_disagg import explain_disaggregated
from planner.requests import ServeRequest

ISSUE = ["--model", "llama-3.1-70b-fp8", "--cluster", "1x8xH100", "--input-len", "1024", "--output-len", "256",
         "--max-ttft-ms", "2000", "--max-tpot-ms", "30", "--mode", "disaggregated"]
CASES = [
    ISSUE,
    # prefill and decode on different nodes: the KV crosses the NICs
    ["--model", "llama-3.1-70b-fp8", "--cluster", "2x8xH100", "--input-len", "8192", "--output-len", "256",
     "--max-ttft-ms", "500", "--max-tpot-ms", "20", "--mode", "disaggregated"],
    ["--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--mode", "disaggregated"],
]


def _json(args: list[str]) -> dict:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_issue_question_exits_0_and_draws_every_section() -> None:
    result = CliRunner().invoke(app, ["explain", *ISSUE])
    assert result.exit_code == 0, result.output
    for section in ("Placement (prefill and decode workers)", "A request's path", "= TTFT", "= E2E",
                    "Memory per GPU, by worker and stage", "Rate matching", "<- binds"):
        assert section in result.stdout
    assert "P0 s0 t0" in result.stdout and "D0 s0 t0" in result.stdout


@pytest.mark.parametrize("args", CASES, ids=lambda a: " ".join(a[1:4]))
def test_explain_shows_the_plans_numbers(args: list[str]) -> None:
    rec = _json([*args, "--json"])["disaggregated"][0]
    e = _json(["explain", *args, "--json"])
    assert (e["ttft_seconds"], e["tpot_seconds"], e["e2e_seconds"]) == (
        rec["ttft_seconds"], rec["tpot_seconds"], rec["e2e_seconds"])
    assert e["goodput_per_gpu"] == rec["goodput_per_gpu"] and e["gpus_used"] == rec["gpus_used"]
    legs = {leg["name"]: leg["seconds"] for leg in e["path"]["to_first_token"]}
    assert legs == pytest.approx({
        "request overhead": rec["first_token_seconds"],
        "queue at prefill": rec["prefill_wait_seconds"],
        "prefill": rec["prefill_seconds"] - rec["prefill_wait_seconds"],
        "KV transfer (exposed)": rec["kv_transfer_seconds"],
        "decode step scheduled ahead": rec["tpot_seconds"],  # async scheduling, vLLM's default
        "first decode round": rec["tpot_seconds"],
    }, rel=1e-12)
    assert sum(legs.values()) == pytest.approx(rec["ttft_seconds"], rel=1e-9)
    (rest,) = e["path"]["after_first_token"]
    assert rest["seconds"] == (int(args[args.index("--output-len") + 1]) - 1 if "--output-len" in args
                               else ServeRequest.output_len - 1) * rec["tpot_seconds"]
    rate = e["rate"]
    assert rate["prefill_requests_per_second"] == rec["prefill_max_requests_per_second"]
    assert rec["prefill_capacity_requests_per_second"] >= rec["prefill_max_requests_per_second"]
    assert rate["decode_requests_per_second"] == rec["decode_max_requests_per_second"]
    assert rate["requests_per_second"] == rec["requests_per_second"] and rate["binding"] == rec["binding"]
    assert rate["prefill_utilization"] == rec["prefill_utilization"]
    stages = [(role, s) for role in ("prefill", "decode") for s in rec[role]["stages"]]
    assert len(e["memory"]) == len(stages)
    for bar, (role, s) in zip(e["memory"], stages, strict=True):
        assert bar["label"].startswith(role)
        assert {seg["name"]: seg["bytes"] for seg in bar["segments"]} == {
            "weights": s["weights_bytes"], "activations": s["activation_bytes"], "overhead": s["overhead_bytes"],
            "KV cache": s["kv_cache_bytes"]}
        assert bar["budget_bytes"] == s["budget_bytes"]


@pytest.mark.parametrize("cluster, request_", [
    ("1x8xH100", ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=2.0, max_tpot_seconds=0.030)),
    ("2x8xH100", ServeRequest(input_len=8192, output_len=256, max_ttft_seconds=0.5, max_tpot_seconds=0.020)),
    ("1x4xH100", ServeRequest(input_len=128, output_len=16)),
])
def test_path_adds_up_and_map_places_every_gpu_once(cluster: str, request_: ServeRequest) -> None:
    model, spec = resolve_model("llama-3.1-70b-fp8"), resolve_cluster(cluster)
    for est in plan_disaggregated(model, spec, request_).candidates:
        x = explain_disaggregated(model, spec, est)
        ttft = sum(leg.seconds for leg in x.path.to_first_token)
        assert ttft == pytest.approx(est.ttft_seconds, rel=1e-12)
        assert ttft + sum(leg.seconds for leg in x.path.after_first_token) == pytest.approx(est.e2e_seconds, rel=1e-12)
        used = [s for s in x.placement.slots if s.role is not None]
        assert len({(s.node, s.local_index) for s in x.placement.slots}) == len(x.placement.slots)
        copies = len(used) // est.gpus_used  # every copy the mapped nodes hold, workers numbered on
        assert len(used) == copies * est.gpus_used and 1 <= copies <= est.copies
        for role, plan in (("prefill", est.prefill), ("decode", est.decode)):
            ranks = {(s.worker, s.stage, s.tp_rank) for s in used if s.role == role}
            assert ranks == {(w, st, t) for w in range(plan.workers * copies) for st in range(plan.pp)
                             for t in range(plan.tp)}
        if est.same_node:  # each worker inside one node, the KV over NVLink
            for role in ("prefill", "decode"):
                nodes = {}
                for s in used:
                    if s.role == role:
                        nodes.setdefault(s.worker, set()).add(s.node)
                assert all(len(n) == 1 for n in nodes.values())


def test_issue_case_by_hand() -> None:
    """1x8xH100, 1024/256, TTFT <= 2 s, TPOT <= 30 ms. TTFT = 13.48 ms (the first-token cost:
    10 ms + the prompt's tokenization on the prefill and then the decode server, 2 x 1,024 x
    1.7 us = 3.4816 ms) + queue + the prompt's prefill + exposed KV + T_d (the step scheduled ahead: async
    scheduling) + T_d; E2E = TTFT + 255 x T_d. The KV is
    I x kv_bytes_per_token = 1024 x 327,680 B (80 layers x 8 KV heads x 128 x 2 (K, V) x 2 B)
    = 320 MiB per request, over NVLink (P and D share the node). The prefill is one step x
    T(b) on a worker of whole rounds; on a pipelined one (tp=1 pp=4 here) the chain's time in
    the worker less the wait (disaggregated.pipelined_prefill_seconds), at least one path."""
    model, spec = resolve_model("llama-3.1-70b-fp8"), resolve_cluster("1x8xH100")
    request = ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=2.0, max_tpot_seconds=0.030)
    est = plan_disaggregated(model, spec, request).recommended
    x = explain_disaggregated(model, spec, est)
    overhead, queue, prefill, kv, ahead, first = (leg.seconds for leg in x.path.to_first_token)
    assert overhead == pytest.approx(0.010 + 2 * 1024 * 1.7e-6)
    assert est.kv.bytes_per_request == 1024 * 80 * 8 * 128 * 2 * 2 and est.kv.link_kind == "nvlink"
    load = est.prefill_load
    assert prefill == pytest.approx(load.prefill_seconds - load.wait_seconds, rel=1e-12) and est.steps_per_prompt == 1
    if not load.chained:
        assert prefill == pytest.approx(est.prefill.round_seconds, rel=1e-12)
    assert first == ahead == est.tpot_seconds
    assert overhead + (queue + prefill) + kv + ahead + first == pytest.approx(est.ttft_seconds, rel=1e-12)
    assert x.path.after_first_token[0].seconds == 255 * est.tpot_seconds
    assert est.ttft_seconds <= 2.0 and est.tpot_seconds <= 0.030


@pytest.mark.parametrize("extra, message", [
    (["--layout", "tp=2"], "--layout"),
    (["--svg", "/nonexistent-dir/x.svg"], "--svg"),
])
def test_refusals_are_one_line_exit_2(extra: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["explain", *ISSUE, *extra])
    assert result.exit_code == 2
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_svg_and_html_save_what_was_printed(tmp_path) -> None:
    svg, html = tmp_path / "pd.svg", tmp_path / "pd.html"
    result = CliRunner().invoke(app, ["explain", *ISSUE, "--svg", str(svg), "--html", str(html)])
    assert result.exit_code == 0, result.output
    assert "<svg" in svg.read_text() and "request" in html.read_text()


def test_nothing_meets_the_sla_exits_1_with_the_rejections() -> None:
    result = CliRunner().invoke(app, ["explain", "--model", "llama-3.1-70b-fp8", "--cluster", "1x8xH100",
                                      "--max-tpot-ms", "0.01", "--mode", "disaggregated"])
    assert result.exit_code == 1
    assert "No disaggregated deployment: none meets the SLA" in result.stdout and "rejected" in result.stdout


def test_explain_disaggregated_on_one_gpu_is_a_usage_error(run_plan):
    """As `plan --mode disaggregated` answers it: one line on stderr, exit 2."""
    done = run_plan("explain", "--model", "llama-3.1-8b", "--cluster", "1x8xH100", "--mode", "disaggregated",
                    "--gpus", "1")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "needs at least 2 GPUs" in done.stderr


def _grid(model_name: str, cluster_name: str, pick) -> tuple[object, list[str]]:
    from planner.explain_disagg import pd_placement
    from planner.render.explain_disagg import pd_placement_lines

    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    found = plan_disaggregated(model, cluster, ServeRequest(input_len=1024, output_len=256), shown=30).candidates
    est = next(e for e in found if pick(e))
    return est, [line.plain for line in pd_placement_lines(pd_placement(cluster, est))]


def test_every_copy_is_drawn_on_its_own_nodes() -> None:
    """70B on 4x8 H100: the planned GPUs run 2 copies of P 1x(tp=1 pp=8) + D 1x(tp=8), each a
    node of prefill and one of decode; nodes 2 and 3 were drawn unused. The second copy's
    workers are P1 and D1 on them."""
    est, lines = _grid("llama-3.1-70b", "4x8xH100", lambda e: e.copies == 2 and not e.same_node
                       and e.prefill.workers == e.decode.workers == 1)
    assert est.gpus_used == 16
    rows = lines[:4]
    assert "unused" not in "".join(rows)
    assert rows[2].split()[2] == "P1" and rows[3].split()[2] == "D1"


def test_same_node_copies_fill_the_nodes() -> None:
    """8B on 4x8 A100, a same-node unit of 8 GPUs (5 prefill, 3 decode) run 4 times: node n
    holds copy n, its workers numbered on from the last copy's (P5..P9 and D3..D5 on node 1)."""
    est, lines = _grid("llama-3.1-8b", "4x8xA100", lambda e: e.copies == 4 and e.same_node and e.gpus_used == 8)
    assert est.prefill.workers == 5 and est.decode.workers == 3
    node1 = lines[1].split()
    assert node1[2] == "P5" and "D5" in node1 and "unused" not in "".join(lines[:4])
