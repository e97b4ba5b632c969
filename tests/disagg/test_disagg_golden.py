"""Golden files for the disaggregated launch commands (one step per role: prefill servers,
decode servers, the proxy/router), and every argv against the release's own flags
(tests/engine_flags/, the `engine_check` fixture). Rewrite after a deliberate change with
`UPDATE_GOLDEN=1 python -m pytest tests/disagg` and review the diff."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from planner.catalog import resolve_cluster, resolve_model
from planner.disagg_cli import disagg_steps
from planner.disagg_search import plan_disaggregated
from planner.engines import EngineVersions
from planner.requests import ServeRequest

GOLDEN_DIR = Path(__file__).resolve().parent.parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
ONE_NODE = ServeRequest(input_len=1024, output_len=256, max_ttft_seconds=2.0, max_tpot_seconds=0.030)
LONG = ServeRequest(input_len=8192, output_len=256, max_ttft_seconds=0.5, max_tpot_seconds=0.020)
MOE = ServeRequest(input_len=4096, output_len=1024, max_ttft_seconds=2.0, max_tpot_seconds=0.050)
LLAMA = ("llama-3.1-70b-fp8", "meta-llama/Llama-3.1-70B-Instruct")
DEEPSEEK = ("deepseek-v3", "deepseek-ai/DeepSeek-V3")
CASES = [
    ("disagg_70b_fp8_1x8xH100_1024_256", "1x8xH100", ONE_NODE),
    ("disagg_across_nodes_70b_fp8_2x8xH100_8192_256", "2x8xH100", LONG),
]
WIDE_CASES = [
    # decode: one EP worker of 16 DP ranks over nodes 0-1; prefill: two pp=8 workers on nodes 2-3
    ("disagg_wide_deepseek_v3_4x8xH200_4096_1024", DEEPSEEK, "4x8xH200", MOE),
]


def steps_for(engine: str, cluster: str, request: ServeRequest, model_names: tuple[str, str] = LLAMA,
              plan_engine: str = "vllm"):
    """`plan_engine`: the engine the search plans for (SGLang's decode workers may pipeline)."""
    model, spec = resolve_model(model_names[0]), resolve_cluster(cluster)
    best = plan_disaggregated(model, spec, request, engine=plan_engine).recommended
    assert best is not None
    return best, disagg_steps(model, spec, request, best, engine, model_names[1])


def path(engine: str, name: str) -> Path:
    versions = EngineVersions()
    folder = f"sglang-{versions.sglang}" if engine == "sglang" else f"vllm-{versions.vllm}"
    return GOLDEN_DIR / folder / f"{name}.txt"


def check_golden(engine: str, name: str, steps, engine_check) -> None:
    """The steps as text equal the golden (rewritten with UPDATE_GOLDEN=1), each argv within
    the release's flags."""
    text = "".join(f"# {step.where}\n{step.shell()}\n" for step in steps)
    target = path(engine, name)
    if UPDATE:
        target.write_text(text, encoding="utf-8")
    assert text == target.read_text(encoding="utf-8")
    for step in steps:
        assert engine_check(step.argv, EngineVersions()) == [], step.shell()


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("name, cluster, request_", CASES)
def test_disagg_golden(engine, name, cluster, request_, engine_check):
    _, steps = steps_for(engine, cluster, request_)
    check_golden(engine, name, steps, engine_check)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("name, model_names, cluster, request_", WIDE_CASES)
def test_disagg_golden_wider_than_a_node(engine, name, model_names, cluster, request_, engine_check):
    _, steps = steps_for(engine, cluster, request_, model_names)
    assert steps is not None
    check_golden(engine, name, steps, engine_check)


def test_roles_and_pairing():
    """One step per role; vLLM's prefill produces the KV, decode consumes it, on distinct GPUs
    and NIXL side-channel ports; the proxy names every prefill and decode server once."""
    best, steps = steps_for("vllm", "1x8xH100", ONE_NODE)
    roles = [s.role for s in steps]
    assert roles == ["prefill", "decode", "proxy"]
    configs = [json.loads(s.argv[s.argv.index("--kv-transfer-config") + 1]) for s in steps[:2]]
    assert [c["kv_role"] for c in configs] == ["kv_producer", "kv_consumer"]
    # both roles name one connector: the push one where the prefill worker pipelines (the
    # pull NixlConnector's decode side reads the prefill's stage 0 only, vLLM 0.33.0)
    connector = "NixlPushConnector" if best.prefill.pp > 1 else "NixlConnector"
    assert all(c["kv_connector"] == connector for c in configs)
    gpus = [set(s.argv[1].split("=")[1].split(",")) for s in steps[:2]]
    assert not gpus[0] & gpus[1]
    assert len(gpus[0]) == best.prefill.gpus and len(gpus[1]) == best.decode.gpus


def test_across_nodes_prefill_and_decode_take_their_own_nodes():
    best, steps = steps_for("sglang", "2x8xH100", LONG)
    assert not best.same_node
    prefill = [s for s in steps if s.role == "prefill"]
    decode = [s for s in steps if s.role == "decode"]
    assert {n for s in prefill for n in s.nodes}.isdisjoint({n for s in decode for n in s.nodes})
    router = steps[-1].argv
    assert "--pd-disaggregation" in router and router.count("--prefill") == len(prefill)


def test_sglang_golden_pipelined_decode(engine_check):
    """Llama-3.1-405B bf16 on 4x8 H100: no decode worker fits a node, so SGLang 0.5.23's decode
    worker runs over pipeline stages, as many as its prefill worker's (both two nodes, --pp-size
    and --nnodes on each server), every argv within 0.5.23's flags."""
    best, steps = steps_for("sglang", "4x8xH100", ServeRequest(input_len=2048, output_len=256),
                            ("llama-3.1-405b", "meta-llama/Llama-3.1-405B-Instruct"), plan_engine="sglang")
    assert best.decode.pp > 1 and best.decode.pp == best.prefill.pp
    decode = [s for s in steps if s.role.startswith("decode")]
    assert decode and all(s.argv[s.argv.index("--pp-size") + 1] == str(best.decode.pp) for s in decode)
    check_golden("sglang", "disagg_pipelined_decode_405b_4x8xH100_2048_256", steps, engine_check)


def test_no_disaggregated_sglang_server_mixes_chunks():
    """A prefill or decode server never runs prompts and decodes in one batch, so none gets
    --enable-mixed-chunk (emit/sglang.server_flags' `mixed`), whether it fits a node or spans
    several (wide_server_steps: DeepSeek-V3's 16-rank decode worker, the 405B pp=8 prefill
    workers); every golden of SGLang's disaggregated launches."""
    goldens = sorted(GOLDEN_DIR.glob("sglang-*/disagg_*.txt"))
    assert len(goldens) >= 6
    servers = [line for golden in goldens for line in golden.read_text(encoding="utf-8").splitlines()
               if "--disaggregation-mode" in line]
    assert len(servers) >= 12
    assert not [line for line in servers if "--enable-mixed-chunk" in line]
