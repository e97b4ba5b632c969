"""Speculative decoding as vLLM runs it (pure; SI units). docs/cost-model.md (Serving:
speculative decoding).

Each decode step of a sequence schedules its own token plus the k tokens the drafter proposed
last step (vllm/v1/core/sched/scheduler.py: num_new_tokens = 1 + len(spec_token_ids), within
the token budget), the target model verifies all k + 1 in one pass (logits for each, the
rejection sampler keeps the longest accepted prefix and one more token), and the drafter then
proposes k new ones (vllm/v1/spec_decode/llm_base_proposer.py, `propose`, at 0.33.0):
- a first pass of the draft over every token of the step (its inputs are the target's hidden
  states), sampling one draft token per request;
- k - 1 more passes over one token per request.
Each pass runs the draft's layers and its LM head on one row per request. ngram proposes on
the host from the prompt: no draft passes on the GPU.

With per-position acceptance a_i (the i-th draft accepted given the ones before were), a
step emits on average 1 + sum_{i=1..k} prod_{j<=i} a_j tokens per sequence (Leviathan et
al. 2023, "Fast Inference from Transformers via Speculative Decoding", sec. 3.1, for i.i.d.
acceptance: (1 - a^(k+1)) / (1 - a)).

Memory: the draft's weights (its layers; MTP and EAGLE share the target's embedding at pp = 1,
MTP its LM head too: vllm/model_executor/models/deepseek_mtp.py, llm_base_proposer._maybe_share_*)
and its layers' KV, drawn from the same pool as the target's, on the last pipeline stage
(gpu_model_runner.py: "we put the entire draft model on the last PP rank").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.cost.params import (
    activation_bytes_per_element,
    kv_bytes_per_token_per_layer_by_kind,
    layer_weight_bytes_per_gpu,
    lm_head_bytes_per_weight,
    num_attention_layers,
)
from planner.requests import Speculation
from planner.specs import ModelSpec


def expected_tokens_per_step(acceptance: tuple[float, ...]) -> float:
    """1 + sum over i of prod_{j <= i} a_j: the tokens one verification step emits per
    sequence on average (k = len(acceptance) drafted)."""
    total, reach = 1.0, 1.0
    for rate in acceptance:
        reach *= rate
        total += reach
    return total


EXACT_DECODE_TOKENS = 256
"""tokens_per_round_for solves the rounds exactly up to this many tokens to emit; beyond, each
further token adds 1 / e rounds (the end's truncation is then settled)."""


def tokens_per_round_for(acceptance: tuple[float, ...], decode_tokens: float) -> float:
    """The mean tokens a request emits per verification step when it has D = `decode_tokens` to
    emit after its first: D / R(D), R the expected steps. A step emits j = 1..k+1 tokens with
    P(j) = a_1 ... a_{j-1} (1 - a_j) (P(k + 1) = a_1 ... a_k), but never more than are left (vLLM
    drops what is accepted past max_tokens), so R(n) = 1 + sum_j P(j) R(n - j), R(n <= 0) = 0.
    At large D this is e = expected_tokens_per_step; at D = 1 one token a step, where D / e
    priced half a step for the last token at e = 2. k = 1, a = 0.5, D = 2: P(1) = P(2) = 0.5,
    R(1) = 1, R(2) = 1 + 0.5 R(1) = 1.5: 2 / 1.5 = 1.333 tokens a step (e = 1.5)."""
    e = expected_tokens_per_step(acceptance)
    if decode_tokens <= 1:
        return 1.0
    emits, reach = [], 1.0
    for rate in acceptance:
        emits.append(reach * (1 - rate))
        reach *= rate
    emits.append(reach)
    whole = math.floor(min(decode_tokens, EXACT_DECODE_TOKENS))
    steps = [0.0] * (whole + 1)
    for n in range(1, whole + 1):
        steps[n] = 1 + sum(p * steps[max(n - j, 0)] for j, p in enumerate(emits, start=1))
    rounds = steps[whole] + (decode_tokens - whole) / e
    return decode_tokens / rounds


def speculation_shape(speculation: Speculation | None, output_len: int | None = None) -> tuple[float, int]:
    """(e, k): tokens a decoding sequence emits per step (expected_tokens_per_step; with
    `output_len` O, for a request with O - 1 tokens to emit after its first:
    tokens_per_round_for) and tokens drafted per sequence and step; (1, 0) without speculative
    decoding."""
    if speculation is None:
        return 1.0, 0
    if output_len is None:
        return expected_tokens_per_step(speculation.acceptance), speculation.num_tokens
    return tokens_per_round_for(speculation.acceptance, output_len - 1), speculation.num_tokens


def mtp_draft_model(model: ModelSpec) -> ModelSpec:
    """The model the MTP drafter runs: the target's block shape, num_mtp_layers deep, every
    block with the target's MLP kind (DeepSeek-V3's MTP block is an MoE block, sec. 2.2 of its
    report), full attention, no recurrent or MLP-only blocks; vocabulary and head the target's
    (shared)."""
    return model.model_copy(update={
        "name": f"{model.name} MTP", "num_hidden_layers": model.num_mtp_layers, "num_mtp_layers": 0,
        "num_dense_layers": 0, "dense_layer_indices": None, "sliding_window": None, "num_sliding_window_layers": None,
        "num_recurrent_layers": 0, "recurrent_kind": None, "num_mlp_only_layers": 0,
        "num_mixer_only_layers": 0})


MAX_DRAFT_LAYER_SHARE = 4
"""A draft head has at most 1/4 of the target's layers (EAGLE heads are one to a few blocks);
more is a model of its own (vLLM's draft_model method), which the planner does not price."""


def draft_reasons(target: ModelSpec, draft: ModelSpec) -> list[str]:
    """Why `draft` cannot be the EAGLE head of `target`: it reads the target's hidden states
    (same width), is a few dense blocks, and predicts within the target's vocabulary."""
    reasons = []
    if draft.hidden_size != target.hidden_size:
        reasons.append(f"hidden_size {draft.hidden_size} differs from {target.name}'s {target.hidden_size} "
                       f"(an EAGLE head reads the target's hidden states)")
    if draft.is_moe:
        reasons.append(f"{draft.name} has routed experts; EAGLE heads are dense blocks")
    if draft.num_hidden_layers * MAX_DRAFT_LAYER_SHARE > target.num_hidden_layers:
        reasons.append(f"{draft.num_hidden_layers} layers against the target's {target.num_hidden_layers}: a draft "
                       f"head has at most 1/{MAX_DRAFT_LAYER_SHARE} of them (a separate draft model is not planned)")
    if draft.vocab_size > target.vocab_size:
        reasons.append(f"vocabulary {draft.vocab_size:,} is larger than the target's {target.vocab_size:,}")
    return reasons


def as_draft_head(target: ModelSpec, draft: ModelSpec, method: str) -> ModelSpec:
    """The draft as vLLM runs it: in the target's dtype (the draft's ModelConfig takes the
    target's, vllm/config/speculative.py at 0.33.0); an EAGLE-1 head predicts through the
    target's LM head (shared), so its vocabulary is the target's; an EAGLE-3 head keeps its own
    (draft_vocab_size)."""
    update: dict[str, object] = {"dtype": target.dtype}
    if method == "eagle":
        update["vocab_size"] = target.vocab_size
    return draft.model_copy(update=update)


def draft_model_of(model: ModelSpec, speculation: Speculation) -> ModelSpec | None:
    """The model the drafter runs on the GPU: the MTP layers, the --draft-model, or None (ngram)."""
    if speculation.method == "mtp":
        return mtp_draft_model(model)
    return speculation.draft  # type: ignore[return-value]


EAGLE3_AUX_HIDDEN_STATES = 3
"""EAGLE-3 feeds its head three of the target's hidden states (low, middle, high layers)."""


def mtp_projection_params(draft: ModelSpec) -> int:
    """An MTP module's eh_proj joining the embedding and the hidden state, 2h -> h per MTP layer,
    replicated on every GPU (a plain nn.Linear, vllm/model_executor/models/deepseek_mtp.py at
    0.33.0), run on every pass."""
    return draft.num_hidden_layers * 2 * draft.hidden_size * draft.hidden_size


def eagle3_fc_params(draft: ModelSpec) -> int:
    """EAGLE-3's fc joining the target's aux hidden states, 3h -> h, replicated on every GPU
    (ReplicatedLinear, vllm/model_executor/models/llama_eagle3.py at 0.33.0)."""
    return EAGLE3_AUX_HIDDEN_STATES * draft.hidden_size * draft.hidden_size


def eagle3_qkv_extra_params(draft: ModelSpec) -> int:
    """Its first layer's qkv projection reads 2h (the embedding beside the fc's output), h more
    than the block shape says: h * (a + 2k) * d, split over TP like the rest of the qkv."""
    return draft.hidden_size * (draft.num_attention_heads + 2 * draft.num_key_value_heads) * draft.head_dim


@dataclass(frozen=True)
class DraftExtras:
    """The drafter's weights beside its blocks and head, on one GPU, by when a step reads them."""

    every_pass_bytes: float
    """Read on every pass: an MTP layer's eh_proj; an EAGLE-3 head's wider first qkv."""
    first_pass_bytes: float
    """Read (and run on every token of the step) in the first pass only: EAGLE-3's fc."""


def draft_extras(draft: ModelSpec, method: str, tp: int) -> DraftExtras:
    """DraftExtras of a drafter of `method` at TP t: replicated projections whole on every GPU,
    the extra qkv split over t like the rest of the qkv."""
    element = activation_bytes_per_element(draft)
    if method == "mtp":
        return DraftExtras(mtp_projection_params(draft) * element, 0.0)
    if method == "eagle3":
        return DraftExtras(eagle3_qkv_extra_params(draft) * element / tp, eagle3_fc_params(draft) * element)
    return DraftExtras(0.0, 0.0)


@dataclass(frozen=True)
class DraftMemory:
    """One GPU's share of the drafter (the last pipeline stage holds it)."""

    weights_bytes: float
    """Its layers (MTP: plus the h x 2h projection that joins embedding and hidden state) and
    its own LM head (EAGLE); the embedding, and MTP's head, are the target's."""
    kv_bytes_per_token: int
    """Its attention layers' KV of one token."""


def draft_memory(model: ModelSpec, speculation: Speculation, tp: int, ep: int, kv_cache_dtype: str,
                 pp: int = 1) -> DraftMemory:
    """DraftMemory of `speculation` on one GPU of a TP group of t (the draft runs at the
    target's TP, vllm/config/speculative.py create_draft_parallel_config; EP kept for an MoE
    draft). With pipeline parallelism the drafter sits on the last stage, away from the
    target's embedding, and loads its own copy (llm_base_proposer._maybe_share_embeddings at
    0.33.0 shares it only at pp = 1)."""
    draft = draft_model_of(model, speculation)
    if draft is None:
        return DraftMemory(0.0, 0)
    extras = draft_extras(draft, speculation.method, tp)
    weights = (draft.num_hidden_layers * layer_weight_bytes_per_gpu(draft, tp, ep)
               + extras.every_pass_bytes + extras.first_pass_bytes)
    if speculation.method == "eagle3":  # its own head over the draft vocabulary; EAGLE-1 shares the target's
        weights += draft.vocab_size * draft.hidden_size * lm_head_bytes_per_weight(draft) / tp
    if pp > 1:
        weights += model.vocab_size * draft.hidden_size * activation_bytes_per_element(model) / tp
    full_kv, _ = kv_bytes_per_token_per_layer_by_kind(draft, tp, kv_cache_dtype)
    return DraftMemory(weights, num_attention_layers(draft) * full_kv)
