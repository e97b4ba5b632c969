"""KV cache transfer from a prefill worker to a decode worker (disaggregated serving; pure, SI).

vLLM's NixlConnector (0.33.0) moves a prompt's KV once its prefill is done: the proxy hands the
request to a decode server, whose scheduler reads every block of the prompt from the prefill
server and schedules the request when the reads complete ("NixlConnector does not do
layerwise saving": save_kv_layer and wait_for_layer_load do nothing,
distributed/kv_transfer/kv_connector/v1/nixl/connector.py). So the whole transfer is in TTFT.
Each decode TP rank reads the heads it holds from the matching prefill rank: n = min(t_P, t_D)
parallel streams of S / n. MLA's latent is not split by heads: every decode TP rank reads the
whole S (vLLM's NIXL worker keeps MLA caches replicated, nixl/base_worker.py), one stream of S
per rank, t_D copies of it per request. A sliding-window layer sends only the blocks still in its
window: NixlConnector clips each sliding-window group's block list to its last
ceil(W / B) + 1 blocks (get_exchange_clipped_blocks, nixl/base_scheduler.py), so a window layer
moves at most that many blocks of a prompt however long it is (gpt-oss: 128-token windows in
half its layers); a recurrent layer (Mamba2, Gated DeltaNet) sends its one state slot
(clip_ssm_state_blocks there).
Legend: S prompt KV bytes (whole model, every layer), I prompt tokens, L layers, n streams,
alpha link latency (s), beta one GPU's link bandwidth (bytes/s). Derivation:
docs/cost-model.md (Serving: disaggregated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.comm import curve_seconds, p2p_seconds
from planner.cost.params import (
    kv_bytes_per_token_per_layer_by_kind,
    num_attention_layers,
    recurrent_state_bytes_per_sequence,
)
from planner.cost.serving_memory import kv_block_tokens
from planner.layout import Link
from planner.specs import AllreduceCurve, ModelSpec


@dataclass(frozen=True)
class LayerKv:
    """One kind of attention layer's share of a prompt's KV: how many layers, and the bytes
    each of them sends per request."""

    num_layers: int
    bytes_per_layer: float


@dataclass(frozen=True)
class KvTransfer:
    """One request's prompt KV, prefill worker -> decode worker."""

    bytes_per_request: float
    """S: every attention layer's blocks of the prompt (a window layer's last ones only)."""
    link_kind: str
    """nvlink | infiniband | roce | ... (the link the bytes cross)."""
    link_scope: str
    """intra_node (P and D share a node) | inter_node (over the NICs)."""
    num_streams: int
    """n: parallel streams, each S / n (MLA: 1 stream of S, read by every decode TP rank)."""
    transfer_seconds: float
    """T_x = sum over layers of alpha + S_l / n / beta: one stream's layer messages back to back."""
    source: str
    """model (alpha-beta) | measured (the probe's 2-rank curve on this link)."""
    copies: int = 1
    """Times S crosses the links per request: 1, or t_D for MLA (every decode TP rank reads the
    whole latent)."""

    @property
    def exposed_seconds(self) -> float:
        """What adds to TTFT: all of T_x (the blocks are read after the prefill ends)."""
        return self.transfer_seconds


def layer_message_seconds(message_bytes: float, link: Link, curve: AllreduceCurve | None) -> float:
    """One layer's message on one stream, a send: the probe's own send/recv fit where the
    profile has one (comm.p2p_seconds: Link.p2p_*), else its 2-rank all-reduce curve at this size
    where it has one (a 2-rank ring all-reduce moves S/beta per rank, as one send does), else
    alpha + S/beta. The all-reduce had come first: on a gloo probe of 4 ranks it measured 7.10 ms
    at 4 MiB where its send took 2.69 ms (a CLI read: a KV handoff priced 2.6 times the sends
    the probe timed)."""
    if curve is not None and not link.has_p2p_fit:
        return curve_seconds(curve, message_bytes)
    return p2p_seconds(message_bytes, link)


def window_tail_tokens(input_len: int, window_tokens: int, block_tokens: int) -> int:
    """Prompt tokens a sliding-window layer sends: the last ceil(W / B) + 1 blocks of its
    ceil(I / B) (NixlConnector's blocks_per_sw), the last of them possibly part full:
    I when the prompt has no more blocks than that, else I - (ceil(I / B) - n) * B."""
    kept = math.ceil(window_tokens / block_tokens) + 1
    dropped = max(0, math.ceil(input_len / block_tokens) - kept)
    return input_len - dropped * block_tokens


def prompt_kv_layers(model: ModelSpec, kv_cache_dtype: str, input_len: int) -> tuple[LayerKv, ...]:
    """The prompt's KV by layer kind: full-attention layers send I tokens each, sliding-window
    layers their window's tail (window_tail_tokens) in blocks of B_w tokens
    (serving_memory.kv_block_tokens), recurrent layers one sequence's state each. Bytes as
    the cache keeps them (params.kv_bytes_per_token_per_layer_by_kind and
    recurrent_state_bytes_per_sequence, the whole layer: t = 1)."""
    layers = num_attention_layers(model)
    window_layers = min(model.num_kv_window_layers, layers)
    full, window = kv_bytes_per_token_per_layer_by_kind(model, 1, kv_cache_dtype)
    kinds = [LayerKv(layers - window_layers, full * input_len)]
    if window_layers:
        tail = window_tail_tokens(input_len, model.kv_window_tokens, kv_block_tokens(window, full, window))
        kinds.append(LayerKv(window_layers, window * tail))
    kinds.append(LayerKv(model.num_recurrent_layers, recurrent_state_bytes_per_sequence(model)))
    return tuple(kind for kind in kinds if kind.num_layers)


def kv_transfer(layers: tuple[LayerKv, ...], prefill_tp: int, decode_tp: int, link: Link,
                curve: AllreduceCurve | None, mla: bool = False, prefill_pp: int = 1,
                decode_pp: int = 1) -> KvTransfer:
    """S = the layers' bytes over n = min(t_P p_P, t_D p_D) streams (MLA: p_D of S / p_D, t_D
    copies), one message per layer and stream of S_l / n: T_x = sum over layers of
    t_msg(S_l / n), all of it exposed. A prefill worker's p_P stages hold different layers, so
    their GPUs send at once: t_P p_P senders against the decode worker's t_D p_D receivers (vLLM's
    decode pp is 1: NIXL refuses a pipelined consumer; SGLang's stages each pull their own
    layers from the prefill stage of the same rank); tp=1 pp=8 to tp=8 is 8 streams, not 1. MLA's
    latent goes whole to every decode TP rank of the stage holding its layer, which each take in
    S / p_D however many stages send it."""
    streams, copies = (decode_pp, decode_tp) if mla else (min(prefill_tp * prefill_pp, decode_tp * decode_pp), 1)
    total = sum(kind.num_layers * kind.bytes_per_layer for kind in layers)
    transfer = sum(kind.num_layers * layer_message_seconds(kind.bytes_per_layer / streams, link, curve)
                   for kind in layers)
    measured = curve is not None or link.has_p2p_fit
    return KvTransfer(total, link.kind, link.scope, streams, transfer, "measured" if measured else "model", copies)


def kv_link_requests_per_second(transfer: KvTransfer, worker_gpus: int) -> float:
    """The prompts per second one worker's links can move: each of its GPUs carries S/n of a
    prompt's KV in T_x (n streams in parallel; MLA: t_D copies of S, one per decode TP rank),
    so its g GPUs move g / (n c) / T_x prompts per second however many workers send or receive. A prefill worker cannot hand over more, nor a
    decode worker take in more, whatever their compute allows (docs/cost-model.md, Serving:
    disaggregated)."""
    return worker_gpus / (transfer.num_streams * transfer.copies) / transfer.transfer_seconds

