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
from planner.requests import MAX_TOKENS, random_range_bounds
from planner.units import BYTES_PER_MIB

_FIELDS = ("input_len", "output_len")
MAX_DATASET_BYTES = 64 * BYTES_PER_MIB
"""A --dataset file larger than this is refused, not read: 64 MiB holds over a million
request lines, ten times --num-prompts' ceiling (a device file such as /dev/zero never ends)."""


def _no_duplicate_keys(where: str):
    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        keys = [key for key, _ in pairs]
        for key in keys:
            if keys.count(key) > 1:
                raise SpecError(f"{where}: {key}: given twice")
        return dict(pairs)
    return hook


def _parse_line(path: Path, line_number: int, text: str) -> tuple[int, int]:
    where = f"{path}: line {line_number}"
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicate_keys(where))
    except json.JSONDecodeError as e:
        raise SpecError(f"{where}: not valid JSON ({e.msg})") from None
    except SpecError:  # a key given twice: already one line naming the line
        raise
    except (RecursionError, ValueError) as e:  # nesting past Python's limit; an integer of > 4,300 digits
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(";")[0]
        raise SpecError(f"{where}: not a request line ({reason})") from None
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
            raise SpecError(f"{where}: {field}: {json.dumps(value)} is not an integer")
        if value < 1:
            raise SpecError(f"{where}: {field}: {value} is not positive")
        if value > MAX_TOKENS:
            raise SpecError(f"{where}: {field}: {value:,} is above {MAX_TOKENS:,} tokens")
        lengths.append(value)
    return lengths[0], lengths[1]


def load_dataset(path: str | Path) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """(input_len, output_len) per non-blank JSONL line `{"input_len": int, "output_len": int}`,
    and each one's line number in the file (for the messages that name a request)."""
    if not str(path).strip():  # Path("") is "." (found by a fuzz sweep: ".: not a regular file")
        raise SpecError("--dataset: empty; give a JSONL file of request lengths")
    path = Path(path)
    if path.exists() and not path.is_file():  # a pipe or a device would block or never end
        raise SpecError(f"{path}: not a regular file (give a JSONL file of request lengths)")
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_DATASET_BYTES + 1)
        if len(raw) > MAX_DATASET_BYTES:
            raise SpecError(f"{path}: larger than {MAX_DATASET_BYTES // BYTES_PER_MIB} MiB (a JSONL of request lengths "
                            f"is far smaller; is it the right file?)")
        text = raw.decode("utf-8-sig")  # a byte-order mark some editors write is not a request
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise SpecError(f"{path}: line {line}: not UTF-8 text (byte {raw[e.start]:#04x})") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    if not numbered:
        raise SpecError(f"{path}: no requests (expected JSONL lines with input_len, output_len)")
    return tuple(_parse_line(path, n, line) for n, line in numbered), tuple(n for n, _ in numbered)


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
    if times[-1] <= 0:  # every draw underflowed (requests.MIN_BURSTINESS keeps it rare): the rescale's end
        return (num_prompts / request_rate_per_s,) * num_prompts
    scale = num_prompts / request_rate_per_s / times[-1]
    return tuple(x * scale for x in times)


def workload_requests(
    lengths: tuple[tuple[int, int], ...],
    num_prompts: int,
    request_rate_per_s: float,
    seed: int = 0,
    burstiness: float = 1.0,
) -> tuple[SimRequest, ...]:
    """num_prompts requests of `lengths` in order, cycled when it is shorter (a dataset's rows
    come here already drawn as vllm bench serve draws them: sampled_dataset_lengths)."""
    assert lengths and num_prompts >= 1
    arrivals = arrival_times_seconds(num_prompts, request_rate_per_s, seed, burstiness)
    return tuple(SimRequest(arrivals[i], *lengths[i % len(lengths)]) for i in range(num_prompts))


def sampled_dataset_lengths(rows: tuple[tuple[int, int], ...], num_prompts: int,
                            seed: int = 0) -> tuple[tuple[int, int], ...]:
    """num_prompts rows as `vllm bench serve` draws them from a custom dataset: the rows
    shuffled (random.seed(seed); random.shuffle), the first num_prompts taken, and when the
    file is shorter, the rest drawn with random.choice from them after reseeding
    (benchmarks/datasets/datasets.py CustomDataset and maybe_oversample_requests, vLLM 0.33.0;
    seed 0 is its default). In file order a burst's replicas (taking every d-th request) can
    get all the long rows or none of them, by the file's pattern alone."""
    assert rows and num_prompts >= 1
    shuffled = list(rows)
    random.Random(seed).shuffle(shuffled)
    taken = shuffled[:num_prompts]
    if len(taken) < num_prompts:
        rng = random.Random(seed)
        taken += [rng.choice(taken[:len(rows)]) for _ in range(num_prompts - len(taken))]
    return tuple(taken)


def random_dataset_lengths(input_len: int, output_len: int, range_ratio: float, num_prompts: int,
                           seed: int = 0) -> tuple[tuple[int, int], ...]:
    """num_prompts (input, output) lengths as `vllm bench serve --dataset-name random
    --random-range-ratio r` draws them: each uniform over the integers of
    [floor(L (1 - r)), ceil(L (1 + r))], outputs at least 1 (RandomDataset.get_sampling_params;
    the special tokens it subtracts from the input are not modelled). Seeded: the same draw
    every time (vLLM's numpy stream is not reproduced, only its distribution)."""
    assert 0 <= range_ratio < 1 and num_prompts >= 1
    rng = random.Random(seed)
    (i_low, i_high), (o_low, o_high) = (random_range_bounds(input_len, range_ratio),
                                        random_range_bounds(output_len, range_ratio))
    return tuple((rng.randint(i_low, i_high), rng.randint(o_low, o_high)) for _ in range(num_prompts))
