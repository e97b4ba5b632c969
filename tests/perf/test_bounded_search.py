"""The bounded training search (train_search.bounded_evaluation) shows the plain search's first rows.

A plan that shows only its best k configurations (the table, --top, plan explain's
re-plans) skips a configuration whose bound (train_search.config_bound: B*s over
step_seconds_floor) is below the k-th best tokens/s found so far. Safe when
  - the floor is below the step of every configuration it bounds, checked against every
    configuration of the exhaustive reference space (test_pruning_safety: the pruning check of
    each case reads the same enumeration, the suite's costliest, so it makes both checks);
  - the first k rows are the plain search's, checked on the pruning cases, random small
    cases and the 131K-token 405B question.
No timing here: bench/bench_plan.py measures the speed.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner import train_search
from planner.catalog import resolve_cluster, resolve_model
from planner.layout import Layout, TrainConfig
from planner.memo import Memo
from planner.requests import TrainRequest
from planner.specs import ClusterSpec, ModelSpec
from planner.train import TrainEstimate, block_seconds_floor, train_rates
from planner.train_search import rank_key, schedule_options, search, step_seconds_floor
from tests.perf.test_pruning_safety import CASES, THIRTY_LAYERS


def _v_max(model: ModelSpec, request: TrainRequest, pp: int) -> int:
    return max(v for _, v in schedule_options(model, request, pp))


def test_the_floor_of_one_configuration_by_hand() -> None:
    """Llama-3.1-8B cut to 30 layers on 2x8 H100, tp=2 pp=4 dp=2, b=2 of B=64: m = 64/(2*2) =
    16 micro-batches, the most loaded of 4 stages holds ceil(30/4) = 8 blocks, and the search's
    largest v at pp 4 is 8 (with the embedding and loss counted as layers (30+2)/4 = 8 units per
    stage, one per chunk), so the floor is 8 * block * (16 + 3/8): 8 blocks for each of the 16
    micro-batches and for the 3/8 of one the bubble adds at best."""
    model, cluster = THIRTY_LAYERS, resolve_cluster("2x8xH100")
    request = TrainRequest(global_batch=64, seq_len=4096)
    v_max = _v_max(model, request, 4)
    assert v_max == 8
    rates, memo = train_rates(model, cluster), Memo()
    config = TrainConfig(2, 4, 2, 2, "1f1b", 1, "none", True, 0, attention="flash")
    block = block_seconds_floor(model, cluster, config, request, rates, memo)
    floor = step_seconds_floor(model, cluster, request, Layout(2, 4, 2), 2, True, "none", v_max, rates, memo)
    assert floor == pytest.approx(8 * block * (16 + 3 / 8), rel=1e-12)


def _top(plan: train_search.TrainPlan, k: int) -> list[tuple]:
    return [(e.config, e.tokens_per_second) for e in plan.layouts[:k]]


def check_bounded_rows(model: ModelSpec, cluster: ClusterSpec, request: TrainRequest, keep_top: int,
                       monkeypatch: pytest.MonkeyPatch) -> train_search.TrainPlan:
    """The bounded search (bounding every search, however small) against the plain one."""
    monkeypatch.setattr(train_search, "BOUNDED_MIN_LAYOUTS", 0)
    plain = search(model, cluster, request)
    bounded = search(model, cluster, request, keep_top=keep_top)
    assert _top(bounded, keep_top) == _top(plain, keep_top)
    assert (bounded.tight_passed_over is None) == (plain.tight_passed_over is None)
    # ranked by rank_key, but for a first row moved up for room in memory (prefer_headroom)
    ranked = list(bounded.layouts[1:] if bounded.tight_passed_over is not None else bounded.layouts)
    assert sorted(ranked, key=rank_key) == ranked
    # what the bounded plan does list it lists as the plain one does
    plain_by_config = {e.config: e for e in plain.layouts}
    assert all(plain_by_config[e.config] == e for e in bounded.layouts)
    return bounded


@pytest.mark.parametrize("keep_top", [1, 3, 10])
@pytest.mark.parametrize("case", list(CASES), ids=lambda c: c)
def test_bounded_search_keeps_the_first_rows(case: str, keep_top: int, monkeypatch: pytest.MonkeyPatch) -> None:
    model_name, cluster_name, global_batch, seq_len = CASES[case]
    check_bounded_rows(resolve_model(model_name), resolve_cluster(cluster_name),
                       TrainRequest(global_batch=global_batch, seq_len=seq_len), keep_top, monkeypatch)


def test_the_bound_skips_something_on_the_pruning_cases(monkeypatch: pytest.MonkeyPatch) -> None:
    """So the test above exercises it: 8B at 16K on 16 A100-40GB, one row."""
    model_name, cluster_name, global_batch, seq_len = CASES["llama-3.1-8b at 16K on 2x8xA100-40GB"]
    bounded = check_bounded_rows(resolve_model(model_name), resolve_cluster(cluster_name),
                                 TrainRequest(global_batch=global_batch, seq_len=seq_len), 1, monkeypatch)
    assert bounded.num_configs_bounded > 0 and bounded.bounded_below_row == 1


@pytest.mark.parametrize("case", ["qwen3-30b-a3b on 1x8xH100", "qwen3-30b-a3b at 8K on 1x8xH100"])
def test_the_bound_skips_something_on_moe(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """MoE is bounded too: the floor leaves the all-to-alls out (training_time.
    exchange_free_block_seconds), one cheap term for every dispatcher and combined 1F1B."""
    model_name, cluster_name, global_batch, seq_len = CASES[case]
    bounded = check_bounded_rows(resolve_model(model_name), resolve_cluster(cluster_name),
                                 TrainRequest(global_batch=global_batch, seq_len=seq_len), 1, monkeypatch)
    assert bounded.num_configs_bounded > 0


def test_the_threshold_counts_only_what_the_launch_keeps(monkeypatch: pytest.MonkeyPatch) -> None:
    """With `counts` refusing the best layout's tp (as a Megatron release refusing a TP degree
    would), the first rows among the rest are the plain search's first rows among the rest."""
    model_name, cluster_name, global_batch, seq_len = CASES["llama-3.1-8b on 2x8xA100-40GB"]
    model, cluster = resolve_model(model_name), resolve_cluster(cluster_name)
    request = TrainRequest(global_batch=global_batch, seq_len=seq_len)
    monkeypatch.setattr(train_search, "BOUNDED_MIN_LAYOUTS", 0)
    plain = search(model, cluster, request)
    refused_tp = plain.layouts[0].config.tp
    bounded = search(model, cluster, request, keep_top=5, counts=lambda e: e.config.tp != refused_tp)
    kept = lambda plan: [(e.config, e.tokens_per_second) for e in plan.layouts if e.config.tp != refused_tp][:5]  # noqa: E731
    assert kept(bounded) == kept(plain)
    assert len(kept(plain)) == 5


@settings(max_examples=10, deadline=None, derandomize=True)
@given(
    model_name=st.sampled_from(["llama-3.1-8b", "mistral-7b", "llama-3.1-70b"]),
    nodes_x_gpus=st.sampled_from([(1, 8), (2, 4), (2, 8), (4, 4)]),
    gpu=st.sampled_from(["A100-40GB", "A100", "H100"]),
    global_batch=st.sampled_from([16, 32, 48, 96]),
    seq_len=st.sampled_from([1024, 4096, 16384]),
    keep_top=st.sampled_from([1, 2, 10]),
)
def test_bounded_search_is_safe_on_random_small_cases(model_name: str, nodes_x_gpus: tuple[int, int], gpu: str,
                                                      global_batch: int, seq_len: int, keep_top: int) -> None:
    num_nodes, gpus_per_node = nodes_x_gpus
    with pytest.MonkeyPatch.context() as monkeypatch:
        check_bounded_rows(resolve_model(model_name), resolve_cluster(f"{num_nodes}x{gpus_per_node}x{gpu}"),
                           TrainRequest(global_batch=global_batch, seq_len=seq_len), keep_top, monkeypatch)


@pytest.mark.parametrize("case", ["llama-3.1-8b on 2x8xA100-40GB", "qwen3-30b-a3b on 1x8xH100"])
def test_bounded_search_keeps_the_first_rows_with_bf16_optimizer_states(case: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """--optimizer-states bf16 (6 or 8 B of optimizer state a parameter, ZeRO-0 dropped): the
    memory bounds the search prunes by read the request's states, so its first rows are the plain
    search's (a review compared 126 such requests, none differing)."""
    model_name, cluster_name, global_batch, seq_len = CASES[case]
    request = TrainRequest(global_batch=global_batch, seq_len=seq_len, optimizer_states="bf16")
    bounded = check_bounded_rows(resolve_model(model_name), resolve_cluster(cluster_name), request, 3, monkeypatch)
    assert all(e.config.optimizer_states == "bf16" and e.config.zero_stage >= 1 for e in bounded.layouts)


def test_the_131k_question_shows_the_plain_searchs_rows() -> None:
    """Llama 3.1 405B at 131,072 tokens on 16,384 H100 (515 candidate layouts: bounded as the
    CLI runs it): the ten rows and their order are the plain search's, most of the space
    bounded out (1,013 of 9,152 feasible configurations estimated: block recompute's floor is
    none's plus one layer's rerun, so fewer full-recompute configurations bound out than when
    full meant every layer, 9 in 10 then)."""
    model, cluster = resolve_model("llama-3.1-405b"), resolve_cluster("2048x8xH100")
    request = TrainRequest(global_batch=2048, seq_len=131072)
    plain = search(model, cluster, request)
    bounded = search(model, cluster, request, keep_top=10)
    assert _top(bounded, 10) == _top(plain, 10)
    assert bounded.num_configs_bounded > plain.num_configs_evaluated
    assert len(bounded.layouts) < len(plain.layouts) // 8
    assert isinstance(bounded.recommended, TrainEstimate) and bounded.recommended.config.tp == 8
