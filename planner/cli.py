"""The thin command line: parse -> load specs -> one planner call -> render.

Every user mistake ends as one line on stderr and exit code 2; "no feasible
layout" is exit code 1; success is 0.
"""

from __future__ import annotations

import inspect
import sys
from enum import Enum
from typing import Annotated

import typer

try:  # typer >= 0.2x vendors click as typer._click
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - older typer depends on click itself
    from click import exceptions as click_exceptions

from planner import __version__
from planner.errors import SpecError
from planner.requests import LayoutFilter, ServeRequest, TrainRequest

EXAMPLES = """Examples:

\b
  plan --model llama-3.1-70b --cluster 2x8xA100
  plan --model model_specs/llama-3.1-405b.yaml --cluster hardware_profiles/2x8xH100.yaml --objective latency
  plan --model ./Llama-3.1-8B/config.json --cluster 1x4xL40S --max-model-len 8192 --json
  plan --workload train --model gpt3-175b --cluster 16x8xA100 --global-batch 1536 --seq-len 2048
  plan explain --model llama-3.1-405b --cluster 2x8xH100
  plan probe --backend gloo --nproc-per-node 2 --out measured.yaml
  plan models | plan clusters | plan gpus
"""

app = typer.Typer(
    name="plan",
    help="Split a large language model over a GPU cluster (tensor x pipeline x data "
    "parallel): why, and how to launch it.\n\n" + EXAMPLES,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=False,
)


class Workload(str, Enum):
    serve = "serve"
    train = "train"


class ObjectiveChoice(str, Enum):
    throughput = "throughput"
    latency = "latency"


class Emit(str, Enum):
    vllm = "vllm"
    vllm_ray = "vllm-ray"
    sglang = "sglang"
    megatron = "megatron"
    none = "none"


class KvCacheDtype(str, Enum):
    auto = "auto"
    fp8 = "fp8"


class QuantChoice(str, Enum):
    none = "none"
    fp8 = "fp8"
    int8 = "int8"
    int4 = "int4"


class Schedule(str, Enum):
    gpipe = "gpipe"
    one_f_one_b = "1f1b"
    interleaved = "interleaved"


class Recompute(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


def fail(message: str, code: int = 2) -> None:
    """One line on stderr, then exit."""
    typer.echo(message.replace("\n", " "), err=True)
    raise typer.Exit(code)


def parse_layout(text: str | None) -> LayoutFilter:
    if not text:
        return LayoutFilter()
    degrees: dict[str, int] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in ("tp", "pp", "dp") or not value.isdigit() or int(value) < 1:
            raise SpecError(f"--layout: {part.strip()!r}: expected tp=N, pp=N or dp=N with N >= 1")
        if key in degrees:
            raise SpecError(f"--layout: {key} given twice")
        degrees[key] = int(value)
    return LayoutFilter(**degrees)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"plan (parallel-planner) {__version__}")
        raise typer.Exit(0)


@app.callback(invoke_without_command=True)
def plan(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Shipped name, model YAML, or HF config.json (file or directory).")] = None,
    cluster: Annotated[str | None, typer.Option(help="Shipped name, hardware profile YAML, or NxMxGPU (e.g. 2x8xA100).")] = None,
    workload: Annotated[Workload, typer.Option(help="serve (vLLM/SGLang) or train (Megatron-LM).")] = Workload.serve,
    gpus: Annotated[int | None, typer.Option(help="Plan for this many of the cluster's GPUs.")] = None,
    layout: Annotated[str | None, typer.Option(help="Keep only layouts matching e.g. tp=8,pp=2.")] = None,
    objective: Annotated[ObjectiveChoice, typer.Option(help="Rank by throughput or latency.")] = ObjectiveChoice.throughput,
    max_tpot_ms: Annotated[float | None, typer.Option(help="Serving SLO: drop layouts slower per output token.")] = None,
    top: Annotated[int, typer.Option(help="Rows to show.")] = 10,
    json_output: Annotated[bool, typer.Option("--json", help="Print JSON (SI units) instead of tables.")] = False,
    show_rejected: Annotated[bool, typer.Option(help="List every rejected layout with its reasons.")] = False,
    emit: Annotated[Emit | None, typer.Option(help="Launch command to print (default: vllm for serve, megatron for train).")] = None,
    input_len: Annotated[int, typer.Option(help="Serve: prompt tokens per request.")] = 1024,
    output_len: Annotated[int, typer.Option(help="Serve: generated tokens per request.")] = 256,
    batch: Annotated[int | None, typer.Option(help="Serve: concurrent sequences per replica (default: as many as fit).")] = None,
    max_model_len: Annotated[int | None, typer.Option(help="Serve: context length (default: the model's max_position_embeddings).")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option(help="Serve: vLLM's fraction of GPU memory.")] = 0.9,
    kv_cache_dtype: Annotated[KvCacheDtype, typer.Option(help="Serve: KV cache dtype.")] = KvCacheDtype.auto,
    quantization: Annotated[QuantChoice | None, typer.Option(help="Weight quantization (overrides the spec).")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(help="Serve: vLLM's token budget per step.")] = None,
    global_batch: Annotated[int | None, typer.Option(help="Train: sequences per optimizer step.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Train: sequence length.")] = None,
    micro_batch: Annotated[int | None, typer.Option(help="Train: fix the micro-batch size.")] = None,
    schedule: Annotated[Schedule | None, typer.Option(help="Train: pipeline schedule.")] = None,
    virtual_stages: Annotated[int | None, typer.Option(help="Train: virtual stages per device (interleaved).")] = None,
    recompute: Annotated[Recompute | None, typer.Option(help="Train: activation recomputation.")] = None,
    sequence_parallel: Annotated[bool | None, typer.Option("--sequence-parallel/--no-sequence-parallel", help="Train: fix sequence parallelism.")] = None,
    zero: Annotated[int | None, typer.Option(help="Train: ZeRO stage 0-3 (1 = distributed optimizer).")] = None,
    served_model: Annotated[str, typer.Option(help="Model argument written into launch commands (path or HF id).")] = "MODEL",
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")] = False,
) -> None:
    """Plan a model on a cluster (the main job)."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        code = _plan(**{k: v for k, v in locals().items() if k != "ctx"})
    except SpecError as exc:
        fail(str(exc))
    raise typer.Exit(code)


def _plan(model, cluster, workload, gpus, layout, objective, max_tpot_ms, top, json_output,
          show_rejected, emit, input_len, output_len, batch, max_model_len,
          gpu_memory_utilization, kv_cache_dtype, quantization, max_num_batched_tokens,
          global_batch, seq_len, micro_batch, schedule, virtual_stages, recompute,
          sequence_parallel, zero, served_model, version) -> int:
    model_spec, cluster_spec, override = _load_specs(model, cluster, quantization, gpus)
    layout_filter = parse_layout(layout)
    if workload is Workload.train:
        request = _train_request(global_batch, seq_len, gpus, layout_filter, micro_batch,
                                 schedule, virtual_stages, recompute, sequence_parallel, zero)
        from planner.train_cli import run_train

        return run_train(model_spec, cluster_spec, request, json_output=json_output, top=top,
                         show_rejected=show_rejected, emit=(emit or Emit.megatron).value)
    request = _serve_request(input_len, output_len, batch, max_model_len, gpu_memory_utilization,
                             kv_cache_dtype, max_num_batched_tokens, gpus, layout_filter, objective,
                             max_tpot_ms, override)
    from planner.serve_cli import run_serve

    return run_serve(model_spec, cluster_spec, request, json_output=json_output, top=top,
                     show_rejected=show_rejected, emit=(emit or Emit.vllm).value,
                     served_model=served_model)


def _load_specs(model, cluster, quantization, gpus):
    if model is None or cluster is None:
        missing = "--model" if model is None else "--cluster"
        fail(f"plan: {missing}: required (try `plan --help`, `plan models`, `plan clusters`)")
    from planner.catalog import resolve_cluster, resolve_model

    model_spec = resolve_model(model)
    override = None
    if quantization is not None:
        wanted = None if quantization is QuantChoice.none else quantization.value
        if wanted is not None and wanted != model_spec.quantization:
            override = wanted  # the engine must quantize a 16-bit checkpoint itself
        model_spec = model_spec.model_copy(update={"quantization": wanted})
    cluster_spec = resolve_cluster(cluster)
    if gpus is not None and not 1 <= gpus <= cluster_spec.num_gpus:
        fail(f"--gpus: {gpus} is outside 1..{cluster_spec.num_gpus} (the cluster's GPUs)")
    return model_spec, cluster_spec, override


def _serve_request(input_len, output_len, batch, max_model_len, gpu_memory_utilization,
                   kv_cache_dtype, max_num_batched_tokens, gpus, layout_filter, objective,
                   max_tpot_ms, quantization_override=None) -> ServeRequest:
    return ServeRequest(
        quantization_override=quantization_override,
        input_len=_positive("--input-len", input_len),
        output_len=_positive("--output-len", output_len),
        batch=None if batch is None else _positive("--batch", batch),
        max_model_len=None if max_model_len is None else _positive("--max-model-len", max_model_len),
        gpu_memory_utilization=_fraction("--gpu-memory-utilization", gpu_memory_utilization),
        kv_cache_dtype=kv_cache_dtype.value,
        max_num_batched_tokens=None if max_num_batched_tokens is None
        else _positive("--max-num-batched-tokens", max_num_batched_tokens),
        num_gpus=gpus,
        layout=layout_filter,
        objective=objective.value,
        max_tpot_seconds=None if max_tpot_ms is None else _positive("--max-tpot-ms", max_tpot_ms) / 1e3,
    )


def _positive(flag: str, value: float) -> float:
    if value <= 0:
        raise SpecError(f"{flag}: must be positive (got {value})")
    return value


def _fraction(flag: str, value: float) -> float:
    if not 0 < value <= 1:
        raise SpecError(f"{flag}: must be in (0, 1] (got {value})")
    return value


def _train_request(global_batch, seq_len, gpus, layout_filter, micro_batch, schedule,
                   virtual_stages, recompute, sequence_parallel, zero) -> TrainRequest:
    if global_batch is None:
        raise SpecError("--global-batch: required for --workload train (sequences per step)")
    if seq_len is None:
        raise SpecError("--seq-len: required for --workload train (tokens per sequence)")
    _positive("--global-batch", global_batch)
    _positive("--seq-len", seq_len)
    if micro_batch is not None:
        _positive("--micro-batch", micro_batch)
    if virtual_stages is not None:
        _positive("--virtual-stages", virtual_stages)
    if zero is not None and zero not in (0, 1, 2, 3):
        raise SpecError(f"--zero: must be 0, 1, 2 or 3 (got {zero})")
    return TrainRequest(
        global_batch=global_batch,
        seq_len=seq_len,
        num_gpus=gpus,
        layout=layout_filter,
        micro_batch=micro_batch,
        schedule=None if schedule is None else schedule.value,
        virtual_stages=virtual_stages,
        recompute=None if recompute is None else recompute.value,
        sequence_parallel=sequence_parallel,
        zero_stage=zero,
    )


@app.command()
def models() -> None:
    """List the shipped model specs."""
    from planner.render.catalog import render_models

    render_models()


@app.command()
def clusters() -> None:
    """List the shipped hardware profiles."""
    from planner.render.catalog import render_clusters

    render_clusters()


@app.command()
def gpus() -> None:
    """List the GPU catalog (dense peaks; blank = unknown)."""
    from planner.render.catalog import render_gpus

    render_gpus()


EXPLAIN_SHARED_OPTIONS = (
    "model", "cluster", "workload", "gpus", "layout", "objective", "max_tpot_ms", "json_output",
    "input_len", "output_len", "batch", "max_model_len", "gpu_memory_utilization", "kv_cache_dtype",
    "quantization", "max_num_batched_tokens", "global_batch", "seq_len", "micro_batch", "schedule",
    "virtual_stages", "recompute", "sequence_parallel", "zero",
)
"""The main command's options that `plan explain` takes too: defined once, on `plan`."""


def _with_plan_options(func):
    """Give a sub-command the main command's EXPLAIN_SHARED_OPTIONS (typer reads the
    signature; the function receives them in **options)."""
    shared = [p for p in inspect.signature(plan, eval_str=True).parameters.values()
              if p.name in EXPLAIN_SHARED_OPTIONS]
    own = [p for p in inspect.signature(func, eval_str=True).parameters.values()
           if p.kind is not inspect.Parameter.VAR_KEYWORD]
    func.__signature__ = inspect.Signature(shared + own)
    return func


@app.command()
@_with_plan_options
def explain(
    svg: Annotated[str | None, typer.Option(help="Also save what was printed as SVG.")] = None,
    html: Annotated[str | None, typer.Option(help="Also save what was printed as HTML.")] = None,
    sensitivity: Annotated[bool, typer.Option("--sensitivity/--no-sensitivity", help="Re-plan with inputs moved +/-20%.")] = True,
    timeline_only: Annotated[bool, typer.Option("--timeline-only", help="Only draw a pipeline schedule (--schedule, --stages, --micro-batches).")] = False,
    stages: Annotated[int, typer.Option(help="--timeline-only: pipeline stages.")] = 4,
    micro_batches: Annotated[int, typer.Option(help="--timeline-only: micro-batches.")] = 4,
    forward_only: Annotated[bool, typer.Option("--forward-only", help="--timeline-only: forwards only (gpipe; the seeds' example).")] = False,
    **options,
) -> None:
    """One layout in depth: placement, memory, collectives, timeline, time, how sure we are."""
    from planner.explain_cli import run_timeline

    try:
        if timeline_only:
            code = run_timeline(options["schedule"], stages, micro_batches, options["virtual_stages"],
                                forward_only, options["json_output"], svg, html)
        else:
            code = _explain(options, svg, html, sensitivity)
    except SpecError as exc:
        fail(str(exc))
    raise typer.Exit(code)


def _explain(o: dict, svg, html, sensitivity: bool) -> int:
    from planner.explain_cli import run_explain

    model_spec, cluster_spec, override = _load_specs(o["model"], o["cluster"], o["quantization"], o["gpus"])
    layout_filter = parse_layout(o["layout"])
    if o["workload"] is Workload.train:
        request = _train_request(o["global_batch"], o["seq_len"], o["gpus"], layout_filter, o["micro_batch"],
                                 o["schedule"], o["virtual_stages"], o["recompute"], o["sequence_parallel"],
                                 o["zero"])
    else:
        request = _serve_request(o["input_len"], o["output_len"], o["batch"], o["max_model_len"],
                                 o["gpu_memory_utilization"], o["kv_cache_dtype"], o["max_num_batched_tokens"],
                                 o["gpus"], layout_filter, o["objective"], o["max_tpot_ms"], override)
    return run_explain(model_spec, cluster_spec, request, json_output=o["json_output"], svg=svg, html=html,
                       sensitivity_runs=sensitivity)


def _register_probe() -> None:
    from planner.probe.command import register

    register(app)


_register_probe()


def main() -> None:
    """Console entry point: one line and exit 2 for every user mistake, never a traceback."""
    try:
        code = app(standalone_mode=False)
    except SpecError as exc:
        typer.echo(str(exc).replace("\n", " "), err=True)
        sys.exit(2)
    except click_exceptions.UsageError as exc:
        typer.echo(f"plan: {exc.format_message()}".replace("\n", " "), err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("plan: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except click_exceptions.ClickException as exc:
        typer.echo(f"plan: {exc.format_message()}".replace("\n", " "), err=True)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
