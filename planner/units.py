"""The only home of unit factors. Inside the planner everything is SI:
bytes (int), seconds, FLOP, bytes/second, FLOP/second. File keys carry human
units (`memory_gib`, `bandwidth_gb_per_s`, `nic_bandwidth_gbit_per_s`,
`latency_us`, `tflops`) and are converted here, once, by the schema.

Note the two different "G"s: NVLink and HBM are quoted in GB/s (1e9 bytes/s),
network links in Gb/s (1e9 bits/s). Memory capacities are GiB (2**30 bytes).
"""

from __future__ import annotations

import math

BYTES_PER_KIB = 2**10
BYTES_PER_MIB = 2**20
BYTES_PER_GIB = 2**30
BYTES_PER_MB = 10**6
BYTES_PER_GB = 10**9
BITS_PER_BYTE = 8
BITS_PER_GBIT = 10**9
SECONDS_PER_US = 1e-6
SECONDS_PER_MS = 1e-3
FLOPS_PER_TFLOPS = 1e12
HZ_PER_KHZ = 10**3
HZ_PER_GHZ = 10**9
COUNT_PER_BILLION = 10**9
"""Parameter counts are shown in billions (B)."""


def gib_to_bytes(gib: float) -> int:
    return int(round(gib * BYTES_PER_GIB))


def bytes_to_gib(num_bytes: float) -> float:
    return num_bytes / BYTES_PER_GIB


def gb_per_s_to_bytes_per_s(gb_per_s: float) -> float:
    return gb_per_s * BYTES_PER_GB


def bytes_per_s_to_gb_per_s(bytes_per_s: float) -> float:
    return bytes_per_s / BYTES_PER_GB


def gbit_per_s_to_bytes_per_s(gbit_per_s: float) -> float:
    return gbit_per_s * BITS_PER_GBIT / BITS_PER_BYTE


def us_to_seconds(us: float) -> float:
    return us * SECONDS_PER_US


def seconds_to_us(seconds: float) -> float:
    return seconds / SECONDS_PER_US


def ms_to_seconds(ms: float) -> float:
    return ms * SECONDS_PER_MS


def seconds_to_ms(seconds: float) -> float:
    return seconds / SECONDS_PER_MS


def tflops_to_flops_per_s(tflops: float) -> float:
    return tflops * FLOPS_PER_TFLOPS


def flops_per_s_to_tflops(flops_per_s: float) -> float:
    return flops_per_s / FLOPS_PER_TFLOPS


def khz_to_hz(khz: float) -> float:
    return khz * HZ_PER_KHZ


def sequences(count: float) -> str:
    """A mean number of sequences: whole from ten up and where whole, else to a tenth (one client
    over two decode workers runs 0.5 each, which printed as 0; a rank loaded to 1.38 printed as 1)."""
    tenth = f"{count:.1f}"
    return f"{count:.0f}" if count >= 10 or count >= 1 and tenth.endswith(".0") else tenth


def ms_above(value_seconds: float, limit_seconds: float, min_digits: int = 1, max_digits: int = 4) -> str:
    """value in ms to `min_digits` decimals, or as many more (up to `max_digits`) as it takes to
    print above the limit: 4.04 ms against a 4 ms limit reads 4.04, not 4.0 (a decode round of
    5.001 ms beside --max-tpot-ms 5 printed as 5.00 in the TPOT-bound note)."""
    for digits in range(min_digits, max_digits + 1):
        text = f"{seconds_to_ms(value_seconds):.{digits}f}"
        if float(text) > seconds_to_ms(limit_seconds):
            break
    return text


def plain(value: float, digits: int = 3) -> str:
    """A count or rate in prose as people write it, `digits` significant digits and never an
    exponent: 2,990 (not 2.99e+03), 1,000,000, 21.2, 0.00153; below 0.001 "under 0.001" (an
    Erlang tail of 1.6e-61 requests is nothing to read). Zero is 0; negatives keep their sign."""
    magnitude = abs(value)
    if magnitude == 0 or math.isinf(magnitude) or math.isnan(magnitude):
        return f"{value:g}"
    if magnitude < PLAIN_SMALLEST:
        return f"under {PLAIN_SMALLEST:g}" if value > 0 else f"above -{PLAIN_SMALLEST:g}"
    if magnitude >= 10 ** (digits - 1):
        return f"{round(value):,}"
    return f"{float(f'{value:.{digits}g}'):f}".rstrip("0").rstrip(".")


PLAIN_SMALLEST = 0.001
"""plain() writes smaller magnitudes as "under 0.001"."""


def plural(n: int, word: str, words: str | None = None) -> str:
    """`1 layout`, `2 layouts` (`words`: the plural where it is not word + s)."""
    return f"{n:,} {word if n == 1 else words or word + 's'}"


def ceil_ms(seconds: float, decimals: int = 1) -> float:
    """`seconds` in ms rounded up to `decimals` places, the least printed limit the value meets
    (87.04 ms -> 87.1; a float's last-digit noise, 87.00000001, stays 87.0)."""
    scale = 10**decimals
    return math.ceil(round(seconds_to_ms(seconds) * scale, 6)) / scale
