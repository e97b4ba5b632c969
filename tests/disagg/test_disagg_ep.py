"""Expert-parallel decode workers in the disaggregated search: a decode worker of tp * d GPUs
whose d DP ranks each run their own attention and batch and share the experts (ep = tp * d).
Its decode rate is d times one rank's, C_d / (O * T_d) each; its GPUs are counted once."""

from __future__ import annotations

import json

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.disagg_search import ep_decode_sizes, plan_disaggregated
from planner.requests import ServeRequest

REQUEST = ServeRequest(input_len=2048, output_len=512, max_ttft_seconds=2.0, max_tpot_seconds=0.05)


@pytest.fixture(scope="module")
def deepseek_plan():
    return plan_disaggregated(resolve_model("deepseek-v3"), resolve_cluster("2x8xH200"), REQUEST)


def test_ep_decode_sizes_fill_a_node_or_whole_nodes():
    """On 8-GPU nodes with 16 GPUs: tp * d in {2, 4, 8} inside a node (dividing 8); 16 would
    leave no GPU for the prefill. Dense models get none."""
    cluster = resolve_cluster("2x8xH200")
    sizes = ep_decode_sizes(resolve_model("deepseek-v3"), cluster, 16)
    assert sizes == [(1, 1, 2), (1, 1, 4), (1, 1, 8), (2, 1, 2), (2, 1, 4), (4, 1, 2)]
    assert all(tp * d < 16 and (8 % (tp * d) == 0 or (tp * d) % 8 == 0) for tp, _, d in sizes)
    assert ep_decode_sizes(resolve_model("llama-3.1-70b"), cluster, 16) == []


def test_deepseek_decode_workers_use_expert_parallelism(deepseek_plan):
    assert deepseek_plan.candidates
    assert any(e.decode.dp > 1 for e in deepseek_plan.candidates)
    best = deepseek_plan.recommended
    assert best.decode.ep == best.decode.tp * best.decode.dp


def test_ep_decode_gpus_counted_once_and_rate_is_d_ranks(deepseek_plan):
    """GPUs: N_p * tp_p * pp_p * d_p + N_d * tp_d * pp_d * d_d, never above the cluster's 16.
    Rate: R <= N_d * d * C_d / (O * T_d), each DP rank finishing C_d sequences every O rounds."""
    for e in deepseek_plan.candidates:
        p, d = e.prefill, e.decode
        assert e.gpus_used == p.workers * p.tp * p.pp * p.dp + d.workers * d.tp * d.pp * d.dp <= 16
        decode_rate = d.workers * d.dp * d.max_num_seqs / (REQUEST.output_len * d.round_seconds)
        assert e.requests_per_second <= decode_rate * (1 + 1e-9) or d.concurrency < d.max_num_seqs
        assert e.goodput_per_gpu == pytest.approx(e.requests_per_second * REQUEST.output_len / e.gpus_used)


def test_ep_decode_worker_launch(run_plan):
    """The EP decode worker is one server per node: vLLM `--data-parallel-size 8
    --enable-expert-parallel` with the NIXL consumer role; SGLang `--tp-size 8 --dp-size 8
    --enable-dp-attention --ep-size 8` in decode mode (`--attn-dp-size 8` from 0.5.23)."""
    import json

    args = ["--model", "deepseek-v3", "--cluster", "2x8xH200", "--input-len", "2048", "--output-len", "512",
            "--max-ttft-ms", "2000", "--max-tpot-ms", "50", "--mode", "disaggregated", "--json"]
    for emit, wanted in (("vllm", ["--enable-expert-parallel", "--data-parallel-size", "8"]),
                         ("sglang", ["--attn-dp-size", "8", "--ep-size", "8"])):
        result = run_plan(*args, "--emit", emit)
        assert result.returncode == 0, result.stderr
        best = json.loads(result.stdout)["disaggregated"][0]
        assert best["decode"]["ep"] == best["decode"]["tp"] * best["decode"]["dp"] == 8
        (decode,) = [step for step in best["launch"] if step["role"] == "decode"]
        text = " ".join(decode["argv"])
        assert " ".join(wanted) in text or all(flag in decode["argv"] for flag in wanted), text


def test_prefill_workers_may_be_expert_parallel():
    """An EP prefill worker of d DP ranks is priced as d lanes in lockstep, each step at one
    rank's load: its capacity is d prompts per step-time of one rank (prefill_rounds)."""
    from planner.catalog import resolve_cluster, resolve_model
    from planner.disagg_search import prefill_rounds, price_shape
    from planner.requests import ServeRequest

    model, cluster = resolve_model("deepseek-v3"), resolve_cluster("4x8xH200")
    request = ServeRequest(input_len=4096, output_len=1024)
    shape = price_shape(model, cluster, request, 1, 1, 163_840, 16)
    worker, seconds = prefill_rounds(model, cluster, request, shape, 8192)
    assert worker.in_flight == 16 and worker.prompts_per_step_max == 2
    assert worker.capacity_requests_per_second == pytest.approx(16 * 2 / seconds(2.0))


def test_deepep_pairs_the_modes_by_role():
    """With a DeepEP backend the disaggregated plan runs vLLM's pairing: high throughput on
    prefill workers, low latency on decode workers; the default and --enable-dbo as given."""
    from planner.disagg_search import role_request
    from planner.requests import ServeRequest

    for backend in ("deepep_low_latency", "deepep_high_throughput"):
        request = ServeRequest(all2all_backend=backend, enable_dbo=True)
        assert role_request(request, "prefill").all2all_backend == "deepep_high_throughput"
        assert role_request(request, "decode").all2all_backend == "deepep_low_latency"
        assert role_request(request, "decode").enable_dbo
    plain = ServeRequest()
    assert role_request(plain, "prefill") is plain and role_request(plain, "decode") is plain


def test_deepep_roles_reach_the_commands(engine_check):
    """An EP prefill worker gets DeepEP's high-throughput kernels, the EP decode worker the
    low-latency ones, both --enable-dbo (vLLM); SGLang's decode also carries its low-latency
    dispatch capacity. Every argv passes the releases' own flags."""
    from planner.disagg_cli import disagg_steps
    from planner.engines import EngineVersions

    model, cluster = resolve_model("deepseek-v3"), resolve_cluster("4x8xH100")
    request = ServeRequest(input_len=8192, output_len=512, max_ttft_seconds=5.0, max_tpot_seconds=0.08,
                           all2all_backend="deepep_low_latency", enable_dbo=True)
    both_ep = next(e for e in plan_disaggregated(model, cluster, request).candidates
                   if e.prefill.dp > 1 and e.decode.dp > 1)
    vllm = disagg_steps(model, cluster, request, both_ep, "vllm", "M")
    for step in vllm:
        argv = list(step.argv)
        if step.role == "proxy":
            continue
        expected = "deepep_high_throughput" if step.role.startswith("prefill") else "deepep_low_latency"
        assert argv[argv.index("--all2all-backend") + 1] == expected and "--enable-dbo" in argv
        assert engine_check(step.argv, EngineVersions()) == []
    for step in disagg_steps(model, cluster, request, both_ep, "sglang", "M"):
        if step.role == "router":
            continue
        argv = list(step.argv)
        mode = "normal" if step.role.startswith("prefill") else "low_latency"
        assert argv[argv.index("--deepep-mode") + 1] == mode
        assert ("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=256" in argv) == (mode == "low_latency")
        assert engine_check(step.argv, EngineVersions()) == []


def test_an_expert_parallel_prefill_worker_is_labelled_with_its_ranks(run_plan):
    """Qwen3-235B fp8 on 2x8 H100: a prefill worker of dp=2 (ep=4) was shown as "2 x tp=2 pp=1",
    two GPUs a worker for 220 GiB of weights (found by a CLI sweep); each row's prefill cell now
    names every degree, so the cell's GPUs add up to its JSON's."""
    args = ("--model", "qwen3-235b-a22b-fp8", "--cluster", "2x8xH100", "--mode", "disaggregated",
            "--max-ttft-ms", "500", "--max-tpot-ms", "30", "--kv-cache-dtype", "fp8")
    text = run_plan(*args).stdout
    rows = json.loads(run_plan(*args, "--json").stdout)["disaggregated"]
    wide = [row["prefill"] for row in rows if row["prefill"]["dp"] > 1]
    assert wide, "a prefill worker over DP ranks is among the candidates"
    p = wide[0]
    assert f"{p['workers']} x tp={p['tp']} pp={p['pp']} dp={p['dp']} ep={p['ep']}" in " ".join(text.split())


def test_vllm_ray_in_auto_mode_labels_the_disaggregated_commands_plain_vllm(run_plan):
    """--emit vllm-ray with --mode auto where disaggregated wins: its servers never use Ray, so
    their commands are headed (vllm) with a note (they were headed "vllm-ray"; --mode
    disaggregated refuses the flag outright)."""
    out = " ".join(run_plan("--model", "deepseek-v3", "--cluster", "8x8xH100", "--kv-cache-dtype", "fp8",
                            "--emit", "vllm-ray").stdout.split())
    assert "Launch disaggregated (vllm):" in out
    assert "--emit vllm-ray applies to the aggregated layout" in out


def test_drafts_take_their_rows_of_the_decode_steps_budget():
    """DeepSeek-V3 decode workers on DeepEP's low-latency kernels (a 256-token step) with one MTP
    draft per sequence: each decoding sequence takes 2 of a step's tokens, so a worker decodes at
    most 256 // 2 = 128 sequences a DP rank (it had priced 256; a CLI read)."""
    from planner.disagg_search import decode_concurrency, price_shape
    from planner.requests import Speculation

    model, cluster = resolve_model("deepseek-v3"), resolve_cluster("2x8xH200")
    request = ServeRequest(input_len=128, output_len=1024, all2all_backend="deepep_low_latency",
                           speculation=Speculation(method="mtp", num_tokens=1, acceptance=(0.8,)))
    shape = price_shape(model, cluster, request, 1, 1, 8192, dp=8)
    assert shape is not None
    assert decode_concurrency(model, cluster, request, shape) == 128
    plain = ServeRequest(input_len=128, output_len=1024, all2all_backend="deepep_low_latency")
    assert decode_concurrency(model, cluster, plain, price_shape(model, cluster, plain, 1, 1, 8192, dp=8)) == 256
