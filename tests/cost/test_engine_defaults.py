"""vLLM's batch defaults per release and GPU (EngineArgs.get_batch_defaults, OpenAI server):
the plan's token budget per step is the release's, so B200 and MI300X plan 16,384 tokens on
vLLM 0.33.0 (>= 160 GiB) where 0.22.0 ran 8,192."""

from __future__ import annotations

import pytest

from planner.catalog import resolve_cluster
from planner.cost.serving_memory import vllm_batch_defaults
from planner.engines import VLLM_RELEASES


@pytest.mark.parametrize("cluster, release, expected", [
    ("1x8xB200", "0.33.0", (16384, 1024)),
    ("1x8xMI300X", "0.33.0", (16384, 1024)),
    ("1x8xH200", "0.33.0", (8192, 1024)),   # 140.4 GiB: the >= 70 GiB tier
    ("1x8xH100", "0.33.0", (8192, 1024)),
    ("1x8xA100", "0.33.0", (2048, 256)),    # an A100 keeps the small budget (vLLM PR #17885)
    ("1x4xL40S", "0.33.0", (2048, 256)),
    ("1x8xB200", "0.22.0", (8192, 1024)),
    ("1x8xMI300X", "0.22.0", (8192, 1024)),
])
def test_batch_defaults(cluster, release, expected):
    assert vllm_batch_defaults(resolve_cluster(cluster), VLLM_RELEASES[release]) == expected


def test_the_plan_uses_the_chosen_release(run_plan):
    """A larger default budget means a larger profile-run activation peak, so less KV cache."""
    import json

    def kv_tokens(*extra: str) -> int:
        out = run_plan("--model", "llama-3.1-70b", "--cluster", "1x8xB200", "--layout", "tp=8",
                       "--max-model-len", "8192", "--json", *extra)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["recommended"]["kv_cache_tokens"]

    assert kv_tokens() < kv_tokens("--engine-version", "vllm=0.22.0")
