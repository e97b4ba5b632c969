"""Serving workloads shaped like `vllm bench serve`'s: request lengths from a JSONL file or drawn
as its random dataset draws them, and arrival times from a request rate
(vllm/benchmarks/serve.py, get_request; vllm/benchmarks/datasets.py, RandomDataset; vLLM 0.33.0)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from planner.cost.serving_sim import SimRequest
from planner.errors import SpecError

_FIELDS = ("input_len", "output_len")


def _parse_line(path: Path, line_number: int, text: str) -> tuple[int, int]:
    where = f"{path}:{line_number}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise SpecError(f"{where}: expected an object with input_len and output_len")
    for key in obj:
        if key not in _FIELDS:
            raise SpecError(f"{where}: {key}: unknown field (expected input_len, output_len)")
    lengths = []
    for field in _FIELDS:
        if field not in obj:
            raise SpecError(f"{where}: {field}: missing")
        value = obj[field]
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{where}: {field}: {value!r} is not an integer")
        if value < 1:
            raise SpecError(f"{where}: {field}: {value} is not positive")
        lengths.append(value)
    return lengths[0], lengths[1]


def load_dataset(path: str | Path) -> tuple[tuple[int, int], ...]:
    """(input_len, output_len) per non-blank JSONL line `{"input_len": int, "output_len": int}`."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise SpecError(f"{path}: cannot read ({reason})") from None
    rows = tuple(
        _parse_line(path, n, line)
        for n, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    )
    if not rows:
        raise SpecError(f"{path}: no requests (expected JSONL lines with input_len, output_len)")
    return rows


def arrival_times_seconds(
    num_prompts: int, request_rate_per_s: float, seed: int = 0, burstiness: float = 1.0
) -> tuple[float, ...]:
    """Send times from the first request, as vllm bench serve draws them.

    Intervals are gamma(shape=burstiness, scale=1/(rate*burstiness)): mean 1/rate, Poisson
    for burstiness 1. The first request waits one interval too, and the cumulative times are
    rescaled so that the last one is exactly num_prompts / rate (vLLM does both). An infinite
    rate sends everything at t = 0. random.Random(seed) replaces numpy's global generator: the
    same distribution, not the same numbers as vLLM for a seed.
    """
    assert num_prompts >= 0 and request_rate_per_s > 0 and burstiness > 0
    if math.isinf(request_rate_per_s) or num_prompts == 0:
        return (0.0,) * num_prompts
    rng = random.Random(seed)
    theta = 1.0 / (request_rate_per_s * burstiness)
    times, t = [], 0.0
    for _ in range(num_prompts):
        t += rng.gammavariate(burstiness, theta)
        times.append(t)
    scale = num_prompts / request_rate_per_s / times[-1]
    return tuple(x * scale for x in times)


def workload_requests(
    lengths: tuple[tuple[int, int], ...],
    num_prompts: int,
    request_rate_per_s: float,
    seed: int = 0,
    burstiness: float = 1.0,
) -> tuple[SimRequest, ...]:
    """num_prompts requests: the dataset's rows in file order, cycled when it is shorter.

    vllm bench serve samples rows and, when the dataset is short, oversamples with
    random.choices; cycling in order is the deterministic stand-in (same length mix when
    num_prompts is a multiple of the dataset size).
    """
    assert lengths and num_prompts >= 1
    arrivals = arrival_times_seconds(num_prompts, request_rate_per_s, seed, burstiness)
    return tuple(SimRequest(arrivals[i], *lengths[i % len(lengths)]) for i in range(num_prompts))


def random_dataset_lengths(input_len: int, output_len: int, range_ratio: float, num_prompts: int,
                           seed: int = 0) -> tuple[tuple[int, int], ...]:
    """num_prompts (input, output) lengths as `vllm bench serve --dataset-name random
    --random-range-ratio r` draws them: each uniform over the integers of
    [floor(L (1 - r)), ceil(L (1 + r))], outputs at least 1 (RandomDataset.get_sampling_params;
    the special tokens it subtracts from the input are not modelled). Seeded: the same draw
    every time (vLLM's numpy stream is not reproduced, only its distribution)."""
    assert 0 <= range_ratio < 1 and num_prompts >= 1
    rng = random.Random(seed)

    def bounds(length: int, at_least: int) -> tuple[int, int]:
        low = max(at_least, math.floor(length * (1 - range_ratio)))
        return low, max(low, math.ceil(length * (1 + range_ratio)))

    (i_low, i_high), (o_low, o_high) = bounds(input_len, 1), bounds(output_len, 1)
    return tuple((rng.randint(i_low, i_high), rng.randint(o_low, o_high)) for _ in range(num_prompts))
