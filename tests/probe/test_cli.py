"""The probe command without running torchrun: errors, printed node commands, missing torch, import hygiene."""

import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from planner.probe.command import register

from .conftest import REPO_ROOT, probe_env

app = typer.Typer()


@app.callback()
def _root() -> None:
    """test app"""


register(app)
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, ["probe", *args])


def test_multi_node_without_rendezvous_is_a_one_line_error():
    result = invoke("--nnodes", "2")
    assert result.exit_code == 2
    assert "--rdzv-endpoint" in result.output and len(result.output.strip().splitlines()) == 1


def test_bad_flags_are_one_line_errors(tmp_path):
    for args in (
        ["--min-bytes", "64", "--max-bytes", "8"],
        ["--repeats", "0"],
        ["--merge-into", str(tmp_path / "missing.yaml")],
        ["--nnodes", "2", "--rdzv-endpoint", "h:1", "--master-addr", "h"],
        ["--nnodes", "2", "--master-addr", "h", "--node-rank", "5"],
        ["--nnodes", "2", "--rdzv-endpoint", "h:99999"],
        ["--nnodes", "2", "--rdzv-endpoint", ":29500"],
        ["--nnodes", "2", "--rdzv-endpoint", "h:\u00b2"],  # isdigit takes it, int() does not
        ["--nnodes", "2", "--rdzv-endpoint", "h:" + "9" * 5000],
        ["--master-port", "0"],
        ["--master-port", "70000"],
    ):
        result = invoke(*args)
        assert result.exit_code == 2, args
        assert len(result.output.strip().splitlines()) == 1, result.output


def test_an_endpoint_without_a_port_takes_torchruns_default():
    assert invoke("--nnodes", "2", "--rdzv-endpoint", "head-node").exit_code == 0


def test_unknown_collective_is_a_one_line_error_naming_flag_and_value():
    result = invoke("--collectives", "all_reduce,alltoall")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "plan probe: --collectives all_reduce,alltoall: unknown collective 'alltoall'; "
        "choose from all_reduce, all_gather, reduce_scatter, send_recv, all_to_all"
    )


def test_a_profile_without_all_reduce_is_refused_before_the_sweep(tmp_path):
    result = invoke("--collectives", "all_to_all", "--out", str(tmp_path / "m.yaml"))
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "--out needs all_reduce" in result.output


def test_a_profile_from_one_process_is_refused_before_the_sweep(tmp_path):
    """One process measures no link: --out wrote a profile with empty curves and no fits, which
    `plan --cluster` then called measured. Refused before anything runs; nothing is written."""
    out = tmp_path / "one.yaml"
    result = invoke("--backend", "gloo", "--nproc-per-node", "1", "--out", str(out))
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "--nproc-per-node 1: one process measures no link" in result.output
    assert not out.exists()
    # nor merged into an existing profile, which it would have stamped "measured" (a read)
    existing = tmp_path / "h100.yaml"
    original = (Path(__file__).resolve().parents[2] / "hardware_profiles" / "1x8xH100.yaml").read_text()
    existing.write_text(original)
    merged = invoke("--backend", "gloo", "--nproc-per-node", "1", "--merge-into", str(existing))
    assert merged.exit_code == 2 and "one process measures no link, so --merge-into" in merged.output
    assert existing.read_text() == original


def test_collectives_travel_to_every_node_and_the_worker():
    result = invoke("--nnodes", "2", "--rdzv-endpoint", "head:29400", "--collectives", "all_to_all")
    assert result.exit_code == 0, result.output
    assert "--collectives all_to_all --run" in result.output
    assert "planner.probe.worker" in result.output and "--collectives all_to_all" in result.output


def test_c10d_prints_the_same_command_for_every_node():
    result = invoke(
        "--nnodes", "2", "--rdzv-endpoint", "head:29400", "--nproc-per-node", "8", "--out", "m.yaml"
    )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if line.strip().startswith("node ")]
    expected = (
        "plan probe --nproc-per-node 8 --nnodes 2 --rdzv-endpoint head:29400 --out m.yaml --run"
    )
    assert [line.split(": ", 1)[1] for line in lines] == [expected, expected]
    assert (
        "-m torch.distributed.run --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint head:29400"
        in result.output
    )


def test_static_rendezvous_prints_one_node_rank_per_node():
    result = invoke("--nnodes", "2", "--master-addr", "10.0.0.1", "--local-addr", "10.0.0.2")
    assert result.exit_code == 0, result.output
    assert "--node-rank 0 --run" in result.output and "--node-rank 1 --run" in result.output
    assert "--local-addr 10.0.0.2" in result.output
    # the torchrun line each node runs names its own rank, not None
    (each,) = [line for line in result.output.splitlines() if line.startswith("Each runs:")]
    assert "--node-rank '<its node rank>'" in each and "None" not in each


def run_python(code):
    return subprocess.run(
        [sys.executable, "-c", code],
        env=probe_env(),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=60,
    )


def test_missing_torch_is_one_line_naming_the_extra():
    code = (
        "import sys; sys.modules['torch'] = None\n"  # find_spec('torch') now answers None
        "from planner.probe.__main__ import app\n"
        "sys.argv = ['plan', 'probe', '--out', 'never.yaml']\n"
        "app()"
    )
    result = run_python(code)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "plan probe: needs torch, which is not installed: pip install 'parallel-planner[probe]'"
    )
    assert not (REPO_ROOT / "never.yaml").exists()


def test_a_torch_that_does_not_import_is_one_line(tmp_path):
    """A broken install (found by find_spec, failing on import) is reported, not a traceback."""
    shadow = tmp_path / "torch"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('libtorch_cuda.so: cannot open shared object file')\n")
    code = (
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n"
        "from planner.probe.__main__ import app\n"
        "sys.argv = ['plan', 'probe', '--out', 'never.yaml']\n"
        "app()"
    )
    result = run_python(code)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("plan probe: torch is installed but does not import (ImportError")
    assert not (REPO_ROOT / "never.yaml").exists()


def test_only_worker_and_measure_import_torch():
    code = (
        "import sys\n"
        "import planner.probe.launcher, planner.probe.command, planner.probe.fit, planner.probe.profile\n"
        "import planner.probe.results, planner.probe.report, planner.probe.runner, planner.probe.sweep\n"
        "import planner.probe.checks, planner.probe.lifeline\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr


def test_gpu_smoke_script_refuses_a_machine_without_cuda():
    """tools/gpu_smoke.py measures a GPU; on a CPU-only machine it says so and exits 2."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the script would measure it")
    script = Path(__file__).resolve().parents[2] / "tools" / "gpu_smoke.py"
    result = subprocess.run([sys.executable, str(script), "--out", "/nonexistent/never-made"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "gpu_smoke: no CUDA GPU visible: this smoke test measures a GPU"
