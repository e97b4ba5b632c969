"""Uneven pipeline stages: how many decoder layers the first and last stage hold (pure).

Legend: L layers, p pipeline stages, v virtual stages (chunks) per device, U = L/v layer
units (one layer per chunk), f / c / l layers on the first / each middle / the last stage,
w seconds per layer on one stage (compute + exposed TP + gradient accumulation), e_f and
e_l the extra seconds of the first stage (embedding) and of the last (LM head + loss).

Megatron-LM semantics (TransformerConfig.__post_init__, "Uneven PP", core_r0.10+;
--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers): f and l are
each > 0, the L - f - l middle layers divide evenly over the p - 2 middle stages, and with
interleaving (v chunks) f, l and c are each divisible by v. With p = 2 there are no
middle stages and f + l = L.

Choice: the split that minimises the slowest stage, max(f*w + e_f, c*w, l*w + e_l), on a
tie the lighter first stage (it holds the most micro-batches in flight under 1F1B), then
the lighter last. Only balanced splits are offered: no stage above ceil(U/p) + 1 units
(the first/last flags cannot balance e.g. 80 layers over 32 stages: 10 | 2 x 30 | 10).
Llama 3 405B (Llama Team 2024, sec. 3.3.2) ran 126 layers on 16 stages as 7 | 8 x 14 | 7,
the split this rule picks.

The third split (account_split): Megatron's --account-for-embedding-in-pipeline-split and
--account-for-loss-in-pipeline-split (TransformerConfig fields, core_v0.14.0 and
core_v0.19.0; megatron/core/transformer/transformer_block.py get_num_layers_to_build)
count the embedding as one layer unit and the loss (output layer) as another: L + 2 units
split evenly, u = (L+2)/(p*v) per chunk, and the first chunk of the first stage builds
u - 1 decoder layers, the last chunk of the last stage u - 1 (>= 0 asserted). Per stage:
v*u - 1 | v*u x (p-2) | v*u - 1 layers. The first/last flags cannot be combined with it
(TransformerConfig.__post_init__ raises).

The layout string (layout_splits): Megatron's --pipeline-model-parallel-layout
(core_v0.14.0 and core_v0.19.0, megatron/core/transformer/pipeline_parallel_layer_layout.py)
names the layers of every one of the p*v chunks, so a stage's layers need not be a multiple
of v: where the flags have no split for an interleaved schedule with p not dividing L and v
dividing ceil(L/p) (DeepSeek-V3's 61 layers on 8 stages of 4 chunks; train.has_layout_split),
any balanced (f, c, l) with at least one layer per chunk is offered (layout_splits), each
stage's layers spread over its chunks as evenly as possible (chunk_layers) and written out
(megatron_layout).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class StageSeconds:
    """Per micro-batch, one stage: layers * seconds_per_layer + the stage's own extra."""

    seconds_per_layer: float
    first_extra_seconds: float
    """Embedding on the first stage (its gradient accumulation)."""
    last_extra_seconds: float
    """LM head, loss and final norm on the last stage."""

    def slowest(self, first: int, middle: int, last: int, pp: int) -> float:
        w = self.seconds_per_layer
        times = [first * w + self.first_extra_seconds, last * w + self.last_extra_seconds]
        if pp > 2:
            times.append(middle * w)
        return max(times)


def max_units_per_stage(num_units: int, pp: int) -> int:
    """The balance bound: ceil(U/p) + 1 layer units on any stage."""
    return math.ceil(num_units / pp) + 1


def candidate_splits(num_layers: int, pp: int, v: int = 1) -> Iterator[tuple[int, int, int]]:
    """Every balanced (f, c, l), in layers, Megatron accepts for an uneven L % p != 0.

    f + (p-2)*c + l = L with f, l >= v, c >= v (p > 2), all multiples of v, none above
    the balance bound. c = 0 when p = 2."""
    if pp < 2 or num_layers % v:
        return
    units = num_layers // v
    bound = max_units_per_stage(units, pp)
    if pp == 2:
        middles = range(0, 1)
    else:  # the first and last stages share rest = U - (p-2)*c units, 2 <= rest <= 2*bound
        lowest = max(1, -(-(units - 2 * bound) // (pp - 2)))
        middles = range(lowest, min(bound, (units - 2) // (pp - 2)) + 1)
    for c in middles:
        rest = units - (pp - 2) * c
        for f in range(max(1, rest - bound), min(bound, rest - 1) + 1):
            yield f * v, c * v, (rest - f) * v


def best_split(num_layers: int, pp: int, v: int, costs: StageSeconds,
               candidates: Iterable[tuple[int, int, int]] | None = None) -> tuple[int, int] | None:
    """(first, last) layers of the fastest balanced split (see the module docstring), or
    None when none exists. The key is costs.slowest, written out (a search asks often).
    `candidates`: candidate_splits(num_layers, pp, v) when the caller has them listed."""
    found = fastest_split(costs, candidate_splits(num_layers, pp, v) if candidates is None else candidates)
    return None if found is None else found[1]


def fastest_split(costs: StageSeconds,
                  candidates: Iterable[tuple[int, int, int]]) -> tuple[float, tuple[int, int]] | None:
    """(its slowest stage's seconds, (first, last) layers) of the fastest (f, c, l) candidate,
    ties to the smaller f, then l; None without candidates. The seconds are costs.slowest's
    (c = 0 when pp = 2 adds a 0 to the max, which stage times never go below)."""
    w, e_first, e_last = costs.seconds_per_layer, costs.first_extra_seconds, costs.last_extra_seconds
    best_key, best = None, None
    for f, c, last in candidates:
        slowest = max(f * w + e_first, last * w + e_last, c * w)
        key = (slowest, f, last)
        if best_key is None or key < best_key:
            best_key, best = key, (f, last)
    return None if best_key is None else (best_key[0], best)


def layout_splits(num_layers: int, pp: int, v: int) -> Iterator[tuple[int, int, int]]:
    """Every balanced (f, c, l) in layers (no stage above ceil(L/p) + 1) with at least one
    layer per chunk (f, l and, p > 2, c >= v), whatever their remainder by v: what Megatron's
    --pipeline-model-parallel-layout expresses."""
    for f, c, last in candidate_splits(num_layers, pp, 1):
        if min(f, last) >= v and (pp == 2 or c >= v):
            yield f, c, last


def needs_layout(layers: tuple[int, ...], v: int) -> bool:
    """Whether a split of these stage layers needs the layout string: some stage's layers are
    not a multiple of its v chunks (the first/last flags need every one to be)."""
    return v > 1 and any(n % v for n in layers)


def chunk_layers(stage_layers: int, v: int) -> tuple[int, ...]:
    """A stage's layers over its v chunks, as even as possible, the larger chunks first:
    7 over 4 -> (2, 2, 2, 1)."""
    base, extra = divmod(stage_layers, v)
    return tuple(base + (i < extra) for i in range(v))


def megatron_layout(layers: tuple[int, ...], v: int, mtp_layers: int = 0) -> str:
    """--pipeline-model-parallel-layout for these stage layers: the p*v chunks in Megatron's
    order (chunk j of stage i is entry j*p + i), "|" between chunks, E (embedding) opening the
    first, t per decoder layer, m per multi-token-prediction module and L (loss) closing the
    last (pipeline_parallel_layer_layout.py core_v0.14.0: MTP after every decoder layer, in the
    last stage's last chunk with the loss). 2 stages of 3 layers, v = 2: "Ett|tt|t|tL"; with one
    MTP module "Ett|tt|t|tmL"."""
    pp = len(layers)
    chunks = [chunk_layers(n, v) for n in layers]
    entries = ["t" * chunks[stage][j] for j in range(v) for stage in range(pp)]
    entries[0] = "E" + entries[0]
    entries[-1] = entries[-1] + "m" * mtp_layers + "L"
    return "|".join(entries)


def stage_layer_indices(layers: tuple[int, ...], v: int = 1) -> list[list[int]]:
    """The decoder layers (0-based) each stage builds: its v chunks (chunk_layers) in Megatron's
    order, chunk j of stage i the (j*p + i)-th run of consecutive layers (megatron_layout's
    order; the flags' even split is the same). 2 stages of 3 layers, v = 2: chunks 2|2|1|1,
    stage 0 layers 0, 1, 4 and stage 1 layers 2, 3, 5."""
    pp = len(layers)
    chunks = [chunk_layers(n, v) for n in layers]
    stages: list[list[int]] = [[] for _ in range(pp)]
    start = 0
    for j in range(v):
        for stage in range(pp):
            stages[stage] += range(start, start + chunks[stage][j])
            start += chunks[stage][j]
    return stages


def has_split(num_layers: int, pp: int, v: int = 1) -> bool:
    """Does Megatron accept some balanced uneven split? (Stops at the first candidate.)"""
    return next(candidate_splits(num_layers, pp, v), None) is not None


def account_split(num_layers: int, pp: int, v: int = 1) -> tuple[int, int] | None:
    """(first, last) stage layers with the embedding and the loss counted as layer units,
    v*u - 1 each with u = (L+2)/(p*v) (the middle stages v*u), or None when p*v does not
    divide L + 2 (Megatron refuses) or a stage would hold no decoder layer (not planned)."""
    units = num_layers + 2
    if pp < 2 or units % (pp * v):
        return None
    per_stage = units // pp
    return (per_stage - 1, per_stage - 1) if per_stage >= 2 else None


def stage_triple(num_layers: int, pp: int, first_last: tuple[int, int]) -> tuple[int, int, int]:
    """(first, middle, last) layers of a split given by its first and last stage (middle 0
    when p = 2): what StageSeconds.slowest takes."""
    first, last = first_last
    return first, (num_layers - first - last) // (pp - 2) if pp > 2 else 0, last


def layers_per_stage(num_layers: int, pp: int, first_last: tuple[int, int] | None) -> tuple[int, ...]:
    """Layers on each stage, first to last: L/p each, or f | c x (p-2) | l."""
    if first_last is None:
        return (num_layers // pp,) * pp
    first, last = first_last
    if pp == 1:
        return (num_layers,)
    middle = (num_layers - first - last) // (pp - 2) if pp > 2 else 0
    return (first,) + (middle,) * (pp - 2) + (last,)


def split_reason(num_layers: int, pp: int, first_last: tuple[int, int], v: int,
                 layout: bool = False) -> str | None:
    """Why Megatron would refuse this explicit split (None: it accepts it); `layout`: written
    as --pipeline-model-parallel-layout (a stage needs only one layer per chunk)."""
    first, last = first_last
    rest = num_layers - first - last
    if pp < 2:
        return "a first/last stage split needs pp > 1"
    if first < 1 or last < 1:
        return f"first/last stage layers {first}/{last} must be > 0"
    if pp == 2 and rest:
        return f"pp=2: first + last layers {first}+{last} must equal {num_layers}"
    if pp > 2 and (rest <= 0 or rest % (pp - 2)):
        return f"middle layers {rest} do not divide over {pp - 2} middle stages"
    layers = layers_per_stage(num_layers, pp, first_last)
    if layout and v > 1 and min(layers) < v:
        return f"stage layers {first}/{layers[1]}/{last}: fewer than one per chunk (v={v})"
    if not layout and v > 1 and any(n % v for n in layers):
        return f"stage layers {first}/{layers[1]}/{last} not all divisible by v={v}"
    return None
