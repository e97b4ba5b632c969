"""DeciLM / Nemotron-NAS block_configs: the Llama-3.3-Nemotron-Super-49B total by hand, and
the per-layer variants the importer refuses in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from planner.cost.params import param_counts
from planner.hf_config import decilm_ffn_size, load_hf_config
from planner.specs import SpecError

SUPER_49B = (Path(__file__).parent / "fixtures" / "hf_configs"
             / "nvidia--Llama-3_3-Nemotron-Super-49B-v1" / "config.json")


def test_nemotron_super_49b_total_by_hand() -> None:
    """h = 8192, 64 heads of 128, vocab 128,256, untied, 80 layers: 49 with attention
    (n_heads_in_group 8 -> 8 KV heads), 31 MLP-only (attention no_op: no input_layernorm).

    FFN widths (int(2 * ffn_mult * 8192 / 3) up to a multiple of 256): 49 x 28,672
    (5.25), 10 x 7,168 (1.3125), 8 x 5,632 (1.0), 6 x 14,336 (2.625), 6 x 2,816 (0.5),
    1 x 17,920 (3.28125): sum 1,642,496, mean 20,531.2 -> intermediate_size 20,531.
    Attention per layer: 2 * 8192 * 8192 + 2 * 8192 * 1024 = 150,994,944; x 49 =
    7,398,752,256. MLPs: 3 * 8192 * 20,531 * 80 = 40,365,588,480 (exact: 3 * 8192 *
    1,642,496 = 40,365,981,696). Norms: (2 * 49 + 31) * 8192 = 1,056,768, final norm 8,192.
    Embedding + LM head: 2 * 128,256 * 8192 = 2,101,346,304.
    Total 49,866,752,000 (exact 49,867,145,216: 393,216 less, under 0.001%)."""
    model = load_hf_config(SUPER_49B)
    assert (model.num_key_value_heads, model.intermediate_size, model.num_mlp_only_layers) == (8, 20531, 31)
    assert param_counts(model).total == 49_866_752_000


def test_ffn_width_is_decilms() -> None:
    assert [decilm_ffn_size(m, 8192) for m in (5.25, 1.3125, 1.0, 2.625, 0.5, 3.28125)] == [
        28672, 7168, 5632, 14336, 2816, 17920]


def _edited(tmp_path: Path, edit: Any) -> Path:
    raw = json.loads(SUPER_49B.read_text())
    edit(raw["block_configs"])
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return path


@pytest.mark.parametrize(("edit", "words"), [
    (lambda b: b[0]["attention"].update(replace_with_linear=True), "replace_with_linear"),
    (lambda b: b[0]["ffn"].update(replace_with_linear=True), "replace_with_linear"),
    (lambda b: b[3]["ffn"].update(no_op=True), "ffn.no_op"),
    (lambda b: b[0]["attention"].update(window_length=4096), "window_length"),
    (lambda b: b[0]["attention"].update(num_sink_tokens=4), "num_sink_tokens"),
    (lambda b: b[0]["attention"].update(n_heads_in_group=4), "n_heads_in_group"),
    (lambda b: b.pop(), "num_hidden_layers"),
])
def test_refused_in_one_line(tmp_path: Path, edit: Any, words: str) -> None:
    with pytest.raises(SpecError, match=words) as exc:
        load_hf_config(_edited(tmp_path, edit))
    assert "\n" not in str(exc.value)
