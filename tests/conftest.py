"""Shared fixtures. Tests run with --import-mode=importlib (pyproject.toml), so test
modules in different folders may share a basename and never import each other: share
through fixtures here, not through imports."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# pytest-xdist's workers inherit COLUMNS=80 and LINES=24 from execnet, where a plain run has
# none: in-process CLI runs (CliRunner) would render for 80 columns and wrap what the tests
# look for. Every worker sees the plain run's environment.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)
CLI_ENV = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
"""Wide output so rich never wraps a name the tests look for."""


def pytest_sessionstart(session: pytest.Session) -> None:
    """Byte-compile the planner once: the suite starts `plan` in some hundreds of processes, and
    where the environment forbids writing byte-code (PYTHONDONTWRITEBYTECODE, set on some CI
    machines) each would compile every module again (tests/test_cli_errors.py: 46 s against
    33 s compiled)."""
    import compileall

    compileall.compile_dir(str(REPO_ROOT / "planner"), quiet=1)


@functools.cache
def _bench_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the scripts' dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def bench_module() -> Callable[[str], ModuleType]:
    """bench_module("serving_calibration") -> bench/serving_calibration.py, loaded once per
    session (the calibration scripts are not a package)."""
    return _bench_module


@pytest.fixture(scope="session")
def training_calibration_summary() -> Callable[[Path], dict]:
    """training_calibration_summary(fixture) -> bench/training_calibration.py's score of that
    fixture's rows, computed once per fixture per session (the NeMo anchor tests)."""
    summaries: dict[Path, dict] = {}

    def summary(fixture: Path) -> dict:
        if fixture not in summaries:
            module = _bench_module("training_calibration")
            summaries[fixture] = module.score(module.load_rows(fixture))
        return summaries[fixture]

    return summary


@pytest.fixture(scope="module")
def nemo_summary(request, training_calibration_summary) -> dict:
    """The score of the calling test module's FIXTURE (the NeMo anchor tests)."""
    return training_calibration_summary(request.module.FIXTURE)


@pytest.fixture(scope="module")
def nemo_scored(nemo_summary) -> dict[str, dict]:
    """nemo_summary's scored rows by id."""
    return {row["id"]: row for row in nemo_summary["rows"]}


@pytest.fixture(scope="session")
def within_todays_error_plus() -> Callable[[float, str, dict, dict], None]:
    """within_todays_error_plus(margin, key, scored, today): an anchor row's |error| is at most
    today's plus `margin` (the NeMo anchor tests)."""

    def check(margin: float, key: str, scored: dict[str, dict], today: dict[str, float]) -> None:
        row = scored[key]
        assert abs(row["error"]) <= abs(today[key]) + margin, (key, row["error"])

    return check


@pytest.fixture(scope="session")
def checkerboard() -> Callable[[str, str], bool]:
    """checkerboard(model, cluster): a quarter of the shipped pairs, every shipped model (on 2-3
    clusters) and every shipped cluster (with 6 models) among them: the pairs whose indices in
    shipped_models() and shipped_clusters() add up to a multiple of 4. The explain sweeps over
    every shipped pair run the sensitivity analysis (sensitivity.LIGHT, some 16 re-plans) on
    these only and every other section on all (the analysis was ~90% of the serving sweep's
    160 s; on half the pairs the sweep still took 100 s of CPU)."""
    from planner.catalog import shipped_clusters, shipped_models

    models, clusters = list(shipped_models()), list(shipped_clusters())
    return lambda model, cluster: (models.index(model) + clusters.index(cluster)) % 4 == 0


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def run_plan() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the CLI as `python -m planner ARGS` would, from the repository root, in a child
    forked from this worker (the planner imported once, so no interpreter start-up: ~0.35 s a
    run otherwise, several minutes over the suite). The child gets the CLI's environment,
    fresh stdout and stderr as files and an empty stdin, runs `planner.cli.main` and leaves with
    its exit code; an uncaught exception prints its traceback as Python would. A fresh
    interpreter is `run_plan_process`."""
    return _run_forked


@pytest.fixture(scope="session")
def run_plan_process() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real CLI (`python -m planner ARGS`) in a new interpreter, from the repository root."""

    def run(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "planner", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_SECONDS,
            env=CLI_ENV,
        )

    return run


CLI_TIMEOUT_SECONDS = 60


def _run_forked(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    import tempfile
    import time

    import planner.cli

    _preload_planner()
    argv = [sys.executable, "-m", "planner", *args]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.chdir(cwd)
                os.environ.clear()
                os.environ.update(CLI_ENV)
                sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
                sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
                sys.argv = [str(REPO_ROOT / "planner" / "__main__.py"), *args]
                # `python -m planner`'s __main__ (click names the program from it: "python -m planner")
                main_module = ModuleType("__main__")
                main_module.__package__, main_module.__file__ = "planner", sys.argv[0]
                sys.modules["__main__"] = main_module
                try:
                    planner.cli.main()
                    code = 0
                except SystemExit as exc:
                    if exc.code is None or isinstance(exc.code, int):
                        code = exc.code or 0
                    else:
                        print(exc.code, file=sys.stderr)
                except BaseException:  # what the interpreter prints for an uncaught exception
                    import traceback

                    traceback.print_exc()
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
            finally:
                os._exit(code)
        deadline = time.monotonic() + CLI_TIMEOUT_SECONDS
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                raise subprocess.TimeoutExpired(argv, CLI_TIMEOUT_SECONDS)
            time.sleep(0.002)
        out.seek(0)
        err.seek(0)
        # as subprocess.run(text=True) reads them: strict UTF-8, universal newlines
        return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status),
                                           *(_text(f.read()) for f in (out, err)))


@functools.cache
def _preload_planner() -> None:
    """Import every planner module, and what they import, and read the GPU catalog once per
    worker before forking: each child would otherwise pay ~0.1 s for them."""
    import pkgutil

    import planner

    for module in pkgutil.walk_packages(planner.__path__, "planner."):
        # not the __main__ modules (importing them runs the CLI) nor the probe's rank code,
        # which imports torch (a larger process to fork, and no CLI child needs it)
        if not module.name.endswith(("__main__", "probe.worker", "probe.measure")):
            importlib.import_module(module.name)
    for name in ("rich.console", "rich.table", "rich.text", "rich.panel", "yaml"):
        importlib.import_module(name)
    from planner.catalog import gpu_catalog

    gpu_catalog()  # read once per process and kept (functools.cache): most runs name a GPU


def _text(data: bytes) -> str:
    return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")


@pytest.fixture(scope="session")
def run_plan_many(
    run_plan: Callable[..., subprocess.CompletedProcess[str]],
) -> Callable[[Mapping[str, Sequence[str]]], dict[str, subprocess.CompletedProcess[str]]]:
    """Run many CLI invocations at once (each costs ~0.3 s of interpreter start-up)."""

    def run_many(
        cases: Mapping[str, Sequence[str]],
    ) -> dict[str, subprocess.CompletedProcess[str]]:
        with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 4)) as pool:
            futures = {key: pool.submit(run_plan, *args) for key, args in cases.items()}
            return {key: future.result() for key, future in futures.items()}

    return run_many


# ------------------------------------------------------------------ launch commands vs the engines

ENGINE_FLAGS_DIR = REPO_ROOT / "tests" / "engine_flags"
"""One JSON per engine release, written by tools/engine_flags.py from the engine's source."""
TORCHRUN_FLAGS = "torchrun-2.13.0"
"""The torch the project pins (README: pip install torch==2.13.0)."""
RAY_START_FLAGS = {"--head", "--port", "--address"}
"""`ray start` flags the vLLM Ray steps use (not extracted: Ray is not read by the tool)."""
ROUTER_FLAGS = "sglang-router"
VLLM_TOY_PROXY_FLAGS = {"--host", "--port", "--prefiller-hosts", "--prefiller-ports", "--decoder-hosts",
                        "--decoder-ports"}
"""vLLM's tests/v1/kv_connector/nixl_integration/toy_proxy_server.py (argparse in its
parse_args; not in the wheel, so not extracted): the proxy the disaggregated commands use."""


def engine_flag_data(name: str) -> dict:
    return _engine_flag_data(name)


@functools.cache
def _engine_flag_data(name: str) -> dict:
    return json.loads((ENGINE_FLAGS_DIR / f"{name}.json").read_text(encoding="utf-8"))


def _flag_problems(args: Sequence[str], data: dict) -> list[str]:
    """Flags the release does not accept, and values outside a flag's choices."""
    problems = []
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, has_inline, inline = arg.partition("=")
        if name not in data["flags"]:
            problems.append(f"{data['engine']} {data['version']}: unknown flag {name}")
            continue
        value = inline if has_inline else (args[i + 1] if i + 1 < len(args) else None)
        choices = data["choices"].get(name)
        if choices and value is not None and not value.startswith(("--", "$")) and value not in choices:
            problems.append(f"{data['engine']} {data['version']}: {name} {value} not in {choices}")
    return problems


def _value(args: Sequence[str], flag: str, default: object = None) -> object:
    return args[list(args).index(flag) + 1] if flag in args else default


def command_problems(argv: Sequence[str], versions) -> list[str]:
    """Why this argv would not start under the releases in `versions` (planner.engines.EngineVersions):
    unknown flags or values (tests/engine_flags/) and the startup pairings that once failed."""
    argv, env = list(argv), {}
    if argv[0] == "env":
        argv.pop(0)
        while "=" in argv[0] and not argv[0].startswith("-"):
            name, _, value = argv.pop(0).partition("=")
            env[name] = value
    if argv[:2] == ["vllm", "serve"]:
        return _vllm_problems(argv[3:], engine_flag_data(f"vllm-{versions.vllm}"))
    if argv[:2] == ["sglang", "serve"] or argv[:3] == ["python", "-m", "sglang.launch_server"]:
        return _sglang_problems(argv, engine_flag_data(f"sglang-{versions.sglang}"))
    if argv[:3] == ["python", "-m", "sglang_router.launch_router"]:
        return _flag_problems(argv[3:], engine_flag_data(ROUTER_FLAGS))
    if argv[0] == "torchrun" and "torchtitan.train" in argv:
        entry = argv.index("-m")
        rest = argv[entry + 2:]
        return (_flag_problems(argv[1:entry], engine_flag_data(TORCHRUN_FLAGS))
                + ([] if rest == ["--job.config_file", rest[-1]] else [f"torchtitan: unexpected arguments {rest}"]))
    if argv[0] == "torchrun":
        script = argv.index("pretrain_gpt.py")
        return (_flag_problems(argv[1:script], engine_flag_data(TORCHRUN_FLAGS))
                + _megatron_problems(argv[script + 1:], env, engine_flag_data(f"megatron-{versions.megatron}")))
    if argv[:2] == ["python3", "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"]:
        return [f"vllm toy proxy: unknown flag {a}" for a in argv[2:]
                if a.startswith("--") and a not in VLLM_TOY_PROXY_FLAGS]
    if argv[:2] == ["ray", "start"]:
        return [f"ray start: unknown flag {a}" for a in argv[2:]
                if a.startswith("--") and a.partition("=")[0] not in RAY_START_FLAGS]
    return [f"unknown command {argv[:3]}"]


def _vllm_problems(args: list[str], data: dict) -> list[str]:
    problems = _flag_problems(args, data)
    world = int(_value(args, "--tensor-parallel-size", 1)) * int(_value(args, "--pipeline-parallel-size", 1))
    world *= int(_value(args, "--data-parallel-size", 1)) if "--nnodes" in args else 1
    nnodes = int(_value(args, "--nnodes", 1))
    if world % nnodes:
        problems.append(f"vllm: --nnodes {nnodes} does not divide the world size {world}")
    budget, max_model_len = _value(args, "--max-num-batched-tokens"), _value(args, "--max-model-len")
    if (data["pairings"].get("budget_below_max_model_len_needs_chunked_prefill") and budget and max_model_len
            and int(budget) < int(max_model_len) and "--enable-chunked-prefill" not in args):
        problems.append(f"vllm {data['version']}: --max-num-batched-tokens {budget} below --max-model-len "
                        f"{max_model_len} without --enable-chunked-prefill")
    if budget and int(_value(args, "--max-num-seqs", 0)) > int(budget):
        problems.append(f"vllm: --max-num-seqs above --max-num-batched-tokens {budget}")
    deprecated = data["pairings"]["online_fp8_quantization_deprecated"]
    if deprecated and _value(args, "--quantization") == "fp8":
        problems.append(f"vllm {data['version']}: --quantization fp8 is deprecated, use {deprecated}")
    return problems


def _sglang_problems(argv: list[str], data: dict) -> list[str]:
    problems = _flag_problems(argv, data)
    tp, pp = int(_value(argv, "--tp-size", 1)), int(_value(argv, "--pp-size", 1))
    dp, nnodes = int(_value(argv, "--dp-size", 1)), int(_value(argv, "--nnodes", 1))
    # DP attention: `--dp-size d --enable-dp-attention`, from 0.5.23 `--attn-dp-size d`
    # (sglang/srt/arg_groups/fields/parallel.py; the old pair is deprecated, read as attn_dp_size = d)
    attn_dp = int(_value(argv, "--attn-dp-size", dp if "--enable-dp-attention" in argv else 1))
    dp_attention = attn_dp > 1 or "--enable-dp-attention" in argv
    # check_server_args: `not (dp_size > 1 and nnodes != 1 and not enable_dp_attention)`,
    # "multi-node data parallel is not supported unless dp attention!"
    if data["pairings"]["dp_size_forbids_multi_node"] and dp > 1 and nnodes > 1 and "--enable-dp-attention" not in argv:
        problems.append("sglang: --dp-size > 1 with --nnodes > 1")
    # _handle_data_parallelism: with DP attention, tp_size % dp_size == 0; the MoE layers
    # split tp_size into moe_tp_size = tp_size // ep_size (python/sglang/srt/layers/dp_attention.py,
    # distributed/parallel_state.py), so ep_size divides tp_size.
    if dp_attention and tp % attn_dp:
        problems.append(f"sglang: DP attention needs its size {attn_dp} to divide --tp-size {tp}")
    if "--attn-dp-size" in argv and "--enable-dp-attention" in argv:
        problems.append("sglang: --attn-dp-size with the deprecated --enable-dp-attention")
    ep = int(_value(argv, "--ep-size", 1))
    if tp % ep:
        problems.append(f"sglang: --ep-size {ep} does not divide --tp-size {tp}")
    if (tp * pp) % nnodes:
        problems.append(f"sglang: --nnodes {nnodes} does not divide tp*pp {tp * pp}")
    if not 0 < float(_value(argv, "--mem-fraction-static", 0.5)) < 1:
        problems.append("sglang: --mem-fraction-static outside (0, 1)")
    return problems


def _megatron_problems(args: list[str], env: dict[str, str], data: dict) -> list[str]:
    problems = _flag_problems(args, data)
    pairings = data["pairings"]
    tp = int(_value(args, "--tensor-model-parallel-size", 1))
    fsdp = "--use-megatron-fsdp" in args
    connections = env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    # validate_args asserts 1 with TP before Blackwell, but only warns beside FSDP or the EP
    # overlap, which the MoE README says needs more than 1 (core_v0.19.0)
    moe_overlap = "--overlap-moe-expert-parallel-comm" in args
    if tp > 1 and not fsdp and not moe_overlap and connections != "1":
        problems.append("megatron: TP > 1 without CUDA_DEVICE_MAX_CONNECTIONS=1")
    if moe_overlap and connections == "1":
        problems.append("megatron: --overlap-moe-expert-parallel-comm with CUDA_DEVICE_MAX_CONNECTIONS=1")
    if fsdp and (connections == "1" or _value(args, "--ckpt-format") != pairings["megatron_fsdp_requires_ckpt_format"]):
        problems.append("megatron: Megatron-FSDP needs --ckpt-format "
                        f"{pairings['megatron_fsdp_requires_ckpt_format']} and CUDA_DEVICE_MAX_CONNECTIONS != 1")
    problems += _pipeline_split_problems(args)
    groups = int(_value(args, "--num-query-groups", _value(args, "--num-attention-heads")))
    if groups % tp and (not pairings["tp_may_exceed_query_groups"] or tp % groups):
        problems.append(f"megatron {data['version']}: num_query_groups {groups} vs tp={tp}")
    return problems + _dispatcher_problems(args, tp, data["version"])


def _dispatcher_problems(args: list[str], tp: int, version: str) -> list[str]:
    """Megatron's token dispatcher rules: --moe-enable-deepep only with the flex dispatcher
    (TransformerConfig.__post_init__ raises, core_v0.14.0 and core_v0.19.0); the flex
    dispatcher needs expert TP x EP > 1 (MoEFlexTokenDispatcher asserts) and, at core_v0.14.0,
    DeepEP enabled (the assert "DeepEP is not enabled"). core_v0.19.0 names the backend with
    --moe-flex-dispatcher-backend (default deepep) and warns that --moe-enable-deepep is
    deprecated: a command for it must not use the old flag."""
    dispatcher = _value(args, "--moe-token-dispatcher-type")
    problems = []
    if "--moe-enable-deepep" in args and dispatcher != "flex":
        problems.append("megatron: --moe-enable-deepep without --moe-token-dispatcher-type flex")
    if "--moe-enable-deepep" in args and version != "core_v0.14.0":
        problems.append(f"megatron {version}: --moe-enable-deepep is deprecated (--moe-flex-dispatcher-backend)")
    if dispatcher == "flex":
        ep = int(_value(args, "--expert-model-parallel-size", 1))
        if ep * int(_value(args, "--expert-tensor-parallel-size", tp)) <= 1:
            problems.append("megatron: the flex dispatcher needs expert TP x EP > 1")
        if version == "core_v0.14.0" and "--moe-enable-deepep" not in args:
            problems.append("megatron core_v0.14.0: the flex dispatcher without --moe-enable-deepep")
    return problems


def _pipeline_split_problems(args: list[str]) -> list[str]:
    """Megatron's layer division (validate_args and TransformerConfig.__post_init__, core_v0.14.0
    and core_v0.19.0): the embedding and loss counted as layers add one unit each, never with the
    first/last flags; then (units) over pp, and per stage over v, divide evenly."""
    if "--num-layers" not in args:
        return []
    layers, pp = int(_value(args, "--num-layers")), int(_value(args, "--pipeline-model-parallel-size", 1))
    if "--pipeline-model-parallel-layout" in args:
        return _layout_string_problems(str(_value(args, "--pipeline-model-parallel-layout")), layers, pp, args)
    v = int(_value(args, "--num-virtual-stages-per-pipeline-rank", 1))
    embedding = "--account-for-embedding-in-pipeline-split" in args
    loss = "--account-for-loss-in-pipeline-split" in args
    first_last = "--decoder-first-pipeline-num-layers" in args or "--decoder-last-pipeline-num-layers" in args
    if first_last:
        return ["megatron: first/last stage layers with the embedding or loss counted"] if embedding or loss else []
    units = layers + embedding + loss
    if units % pp or (units // pp) % v:
        return [f"megatron: {units} layer units do not divide over pp={pp} x v={v}"]
    return []


def _layout_string_problems(layout: str, layers: int, pp: int, args: list[str]) -> list[str]:
    """--pipeline-model-parallel-layout (PipelineParallelLayerLayout, core_v0.14.0 and
    core_v0.19.0): '|'-separated chunks, a multiple of pp of them (v per rank), 't' a decoder
    layer, 'E' the embedding in the first chunk, 'L' the loss in the last; the decoder layers
    add up to --num-layers; 'm' an MTP layer, as many as --mtp-num-layers, all in the last chunk
    after its decoder layers (validate_layer_layout); not with the first/last-stage or
    per-virtual-stage flags."""
    chunks = layout.split("|")
    problems = []
    mtp = int(args[args.index("--mtp-num-layers") + 1]) if "--mtp-num-layers" in args else 0
    if layout.count("m") != mtp:
        problems.append(f"megatron: layout has {layout.count('m')} MTP layers, --mtp-num-layers {mtp}")
    if mtp and (layout.count("m") != chunks[-1].count("m") or "t" in chunks[-1][chunks[-1].index("m"):]):
        problems.append("megatron: MTP layers not together after the decoder layers in the last chunk")
    if len(chunks) % pp:
        problems.append(f"megatron: layout of {len(chunks)} chunks over pp={pp}")
    if sum(chunk.count("t") for chunk in chunks) != layers:
        problems.append(f"megatron: layout places {layout.count('t')} layers, --num-layers {layers}")
    if layout.count("E") != 1 or "E" not in chunks[0] or layout.count("L") != 1 or "L" not in chunks[-1]:
        problems.append("megatron: layout without E first and L last")
    if set(layout) - set("tmEL|"):
        problems.append(f"megatron: layout has other modules {set(layout) - set('tmEL|')}")
    clash = [flag for flag in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                               "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                               "--account-for-embedding-in-pipeline-split") if flag in args]
    return problems + [f"megatron: {flag} with a layout string" for flag in clash]


@pytest.fixture(scope="session")
def engine_check() -> Callable[..., list[str]]:
    """engine_check(argv, EngineVersions()) -> why the argv would not start ([] if it would)."""
    return command_problems
