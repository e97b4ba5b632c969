"""train.least_memory: the memory no stage split (and no memory fallback) of a configuration
goes below, on which estimate() rejects a configuration before pricing its stage times.

The claim that makes it safe: a configuration it rejects is one the full estimate (stage
times, the fastest split that fits, the fallbacks without combined 1F1B and without DeepEP)
would reject for memory too, and every configuration it lets through is estimated exactly as
before. Checked here against the estimate with the shortcut taken out, over whole search
spaces with uneven stage splits, MoE fallbacks and CP.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from planner import train
from planner.catalog import resolve_cluster, resolve_model
from planner.layout import Rejected, TrainConfig
from planner.memo import Memo
from planner.requests import TrainRequest
from planner.train import (
    TrainEstimate,
    estimate,
    least_memory,
    split_candidates,
    train_rates,
    trained_model,
)
from tests.perf.test_pruning_safety import THIRTY_LAYERS, every_config

CASES = {
    # 30 layers: pp 4 and 8 split unevenly (Megatron's first/last splits, the account split)
    "30-layer Llama on 2x8xA100-40GB": (THIRTY_LAYERS, "2x8xA100-40GB", 64, 4096),
    # MoE: EP with the combined 1F1B and DeepEP's buffers to fall back from
    "qwen3-30b-a3b on 1x8xH100": (resolve_model("qwen3-30b-a3b"), "1x8xH100", 32, 2048),
}


def _without_shortcut(*_: object) -> tuple[SimpleNamespace, bool]:
    return SimpleNamespace(total_bytes=0.0, stage=0), False


@pytest.mark.parametrize("case", CASES, ids=lambda c: c)
def test_the_shortcut_rejects_only_what_the_full_estimate_rejects_for_memory(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model, cluster_name, global_batch, seq_len = CASES[case]
    cluster = resolve_cluster(cluster_name)
    request = TrainRequest(global_batch=global_batch, seq_len=seq_len)
    rates = train_rates(trained_model(model, request), cluster)
    configs = list(every_config(model, cluster.num_gpus, request.attention, cluster.gpus_per_node, request))
    fast = [estimate(model, cluster, c, request, rates, Memo()) for c in configs]
    monkeypatch.setattr(train, "least_memory", _without_shortcut)
    full = [estimate(model, cluster, c, request, rates, Memo()) for c in configs]
    shortcuts = 0
    for config, quick, slow in zip(configs, fast, full, strict=True):
        if isinstance(slow, TrainEstimate):
            assert quick == slow, config
        elif isinstance(quick, Rejected) and quick.over_bytes > 0 and slow.over_bytes > 0:
            # the least any split needs, at most the overshoot the full estimate reports
            assert quick.over_bytes <= slow.over_bytes * (1 + 1e-12), config
            shortcuts += quick.over_bytes < slow.over_bytes
        else:
            assert quick == slow, config
    assert sum(isinstance(r, TrainEstimate) for r in fast) > 20
    assert sum(isinstance(r, Rejected) and r.over_bytes > 0 for r in fast) > 20


def test_no_stage_split_goes_below_it() -> None:
    """30 layers over 4 stages, 2 chunks each: every split the estimate may take holds at
    least least_memory on its worst stage, and least_memory gives each stage kind the fewest
    layers of any split."""
    model, cluster = THIRTY_LAYERS, resolve_cluster("2x8xA100-40GB")
    request = TrainRequest(global_batch=64, seq_len=4096)
    config = TrainConfig(2, 4, 2, 1, "interleaved", 2, "none", True, 1, attention="flash")
    m = 64 // (1 * 2)
    least, uneven = least_memory(model, config, request, m, Memo(), 1.0)
    assert uneven
    triples = [t for _, t in split_candidates(30, 4, 2, "megatron")]
    fewest = (min(t[0] for t in triples), min(t[1] for t in triples), min(t[2] for t in triples))
    assert least.num_layers == fewest[train.stage_kind(least.stage, 4)]
    options = train.stage_split_options(model, cluster, config, request.seq_len, train_rates(model, cluster))
    assert options is not None and len(options.ordered()) > 1  # 30 layers over 4 stages cannot be even
    for named, layers in options.ordered():
        split = train.split_memory(model, train.with_split(config, named), request.seq_len, m, Memo(), 1.0, layers)
        assert split.worst.total_bytes >= least.total_bytes


def test_even_stages_give_the_configurations_own_memory() -> None:
    """Where the stages are even there is one split: least_memory is the configuration's memory."""
    model = resolve_model("llama-3.1-8b")
    request = TrainRequest(global_batch=64, seq_len=4096)
    config = TrainConfig(2, 4, 1, 1, "1f1b", 1, "none", True, 0, attention="flash")  # 32 layers, 8 a stage
    assert least_memory(model, config, request, 64, Memo(), 1.0) == (train.memory_per_gpu(model, config, 4096, 64), False)
