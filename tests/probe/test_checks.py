"""What `plan probe` refuses before it measures (no torch, no torchrun).

Each case is run in-process with the launch replaced by a recorder and the temp dir
root moved into tmp_path: a case passes only with exit code 2, one line naming the
flag (and file) and the problem, no launch recorded and no temp dir made. A few
cases also go through the real console entry (`python -m planner probe`).
"""

import errno
import os
import subprocess
import sys
import tempfile

import pytest
import typer
import yaml
from typer.testing import CliRunner

from planner.probe import checks, launcher
from planner.probe.command import register

from .conftest import REPO_ROOT, probe_env

app = typer.Typer()


@app.callback()
def _root() -> None:
    """test app"""


register(app)

GOOD_PROFILE = {
    "name": "lab",
    "num_nodes": 1,
    "gpus_per_node": 2,
    "gpu": "A100-SXM4-80GB",
    "intra_node": {"kind": "nvlink", "bandwidth_gb_per_s": 300.0, "latency_us": 3.0},
}
CPU_RUN = ["--backend", "gloo", "--nproc-per-node", "2"]  # no GPU detection, no torch import


@pytest.fixture
def no_launch(tmp_path, monkeypatch):
    """Launches recorded instead of run; temp dirs made under tmp_path/tmp; torch not needed."""
    launches = []
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp_root))
    monkeypatch.setattr(launcher, "require_torch", lambda: None)
    monkeypatch.setattr(launcher, "visible_gpu_count", lambda: 0)
    monkeypatch.setattr(launcher, "run_with_progress", lambda *args, **kw: launches.append(args))
    yield launches
    assert launches == [], "a check that must come before the launch came after it"
    assert not list(temp_root.iterdir()), "a temp dir was made: the run got as far as launching"


def refused(*args):
    """The one line `plan probe args` prints, having exited with code 2."""
    result = CliRunner().invoke(app, ["probe", *CPU_RUN, *args])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def write_profile(path, **change):
    document = {**GOOD_PROFILE, **change}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_out_that_is_a_directory(tmp_path, no_launch):
    assert (
        refused("--out", str(tmp_path))
        == f"plan probe: --out {tmp_path}: is a directory; give a file path"
    )


@pytest.mark.parametrize("flag", ["--out", "--merge-into"])
def test_an_empty_output_path_is_named_empty(flag, no_launch):
    """Path("") is ".": an empty --out read "--out .: is a directory" (found by a fuzz sweep)."""
    assert refused(flag, "") == f"plan probe: {flag}: empty; give a file path"


def test_merge_into_a_directory(tmp_path, no_launch):
    line = refused("--merge-into", str(tmp_path))
    assert line == f"plan probe: --merge-into {tmp_path}: is a directory; give a file path"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
@pytest.mark.parametrize("target", ["/proc/probe.yaml", "/proc/self/status", "/sys/probe.yaml"])
def test_out_on_a_kernel_pseudo_filesystem(target, no_launch):
    line = refused("--out", target)
    assert line.startswith(f"plan probe: --out {target}: ") and "pseudo-filesystem" in line


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="needs /dev/null")
def test_out_that_is_not_a_regular_file(no_launch):
    assert refused("--out", "/dev/null") == "plan probe: --out /dev/null: not a regular file"


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write a read-only directory"
)
def test_out_in_a_read_only_directory(tmp_path, no_launch):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        line = refused("--out", str(locked / "m.yaml"))
    finally:
        locked.chmod(0o755)
    assert line.startswith(
        f"plan probe: --out {locked / 'm.yaml'}: cannot create a file in {locked}"
    )


def test_out_on_a_read_only_filesystem(tmp_path, no_launch, monkeypatch):
    """As root too: the create-and-remove check sees what the final write would (EROFS here)."""

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(checks.tempfile, "NamedTemporaryFile", read_only)
    line = refused("--out", str(tmp_path / "m.yaml"))
    assert line == (
        f"plan probe: --out {tmp_path / 'm.yaml'}: cannot create a file in {tmp_path}: "
        f"{os.strerror(errno.EROFS)}"
    )


def test_the_writability_check_leaves_nothing_behind(tmp_path):
    checks.check_writable_target("--out", tmp_path / "m.yaml")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "change, field",
    [
        ({"intra_node": 5}, "intra_node"),
        (
            {"intra_node": {"kind": "nvlink", "bandwidth_gb_per_s": "fast", "latency_us": 3.0}},
            "intra_node.bandwidth_gb_per_s",
        ),
        ({"num_nodes": 2, "inter_node": 7}, "inter_node"),
        ({"gpu": "FOO"}, "gpu: unknown GPU"),
    ],
    ids=["intra_node-int", "bandwidth-word", "inter_node-int", "unknown-gpu"],
)
def test_merge_into_a_profile_that_plan_would_reject(tmp_path, no_launch, change, field):
    path = write_profile(tmp_path / "p.yaml", **change)
    before = path.read_text()
    line = refused("--merge-into", str(path))
    assert line.startswith(f"plan probe: --merge-into {path}: {field}"), line
    assert path.read_text() == before


def test_merge_into_a_binary_file(tmp_path, no_launch):
    """Not a codec error without a name: the file, what is wrong, before any launch."""
    path = tmp_path / "p.yaml"
    path.write_bytes(b"\xb7\x00\xff" * 100)
    line = refused("--merge-into", str(path))
    assert line.startswith(f"plan probe: --merge-into {path}: cannot read: not UTF-8 text"), line


def test_a_good_merge_profile_and_out_pass_every_check(tmp_path, no_launch):
    """The checks refuse only what is wrong: this run gets to the launch (recorded, then undone)."""
    path = write_profile(tmp_path / "p.yaml")
    result = CliRunner().invoke(
        app, ["probe", *CPU_RUN, "--merge-into", str(path), "--out", str(tmp_path / "m.yaml")]
    )
    assert len(no_launch) == 1, result.output
    no_launch.clear()  # the fixture's check is for the refused cases (the temp dir is gone again)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-5", "1e300"])
def test_timeout_that_is_not_a_positive_finite_number(value, no_launch):
    line = refused("--timeout", value)
    assert line.startswith("plan probe: --timeout must be a positive, finite number of seconds")


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--min-bytes", "0"], "plan probe: --min-bytes must be at least 4 (one float32), got 0"),
        (["--max-bytes", "2"], "plan probe: --max-bytes must be at least 4 (one float32), got 2"),
        (
            ["--min-bytes", "64", "--max-bytes", "8"],
            "plan probe: --min-bytes must not exceed --max-bytes",
        ),
        (
            ["--min-bytes", "1000000000"],
            "plan probe: --min-bytes 1000000000 exceeds --max-bytes 4194304 (the CPU default)",
        ),
        (["--step-factor", "1"], "plan probe: --step-factor must be at least 2, got 1"),
    ],
)
def test_sweep_bounds(args, expected, no_launch):
    assert refused(*args) == expected


@pytest.mark.parametrize("bounds", [["--min-bytes", "1024", "--max-bytes", "1024"],
                                    ["--min-bytes", "1024", "--max-bytes", "1027"],  # 1,027 rounds down to 1,024
                                    ["--min-bytes", "4194304"]])  # the CPU default maximum
def test_one_message_size_cannot_write_a_profile(bounds, no_launch, tmp_path):
    """A profile's link figures are a latency + bandwidth fit, which one size cannot separate:
    the sweep ran to the end and then wrote nothing; it is refused before the launch."""
    line = refused(*bounds, "--out", str(tmp_path / "p.yaml"))
    assert line.startswith("plan probe: --min-bytes ") and "is one message size: --out fits" in line


def test_max_bytes_beyond_this_nodes_memory(no_launch):
    line = refused("--max-bytes", str(2**50))
    assert line.startswith(f"plan probe: --max-bytes {2**50}: 2 ranks x 3 buffers need")
    assert "more than this node's" in line


def test_unknown_gpu(no_launch):
    line = refused("--gpu", "FOO")
    assert line.startswith("plan probe: --gpu: unknown GPU 'FOO' (known: A100")


def test_unknown_gpu_is_refused_before_printing_node_commands():
    result = CliRunner().invoke(
        app, ["probe", "--nnodes", "2", "--rdzv-endpoint", "h:1", "--gpu", "FOO"]
    )
    assert result.exit_code == 2 and "unknown GPU 'FOO'" in result.output


@pytest.mark.parametrize(
    "args, words",
    [
        (["--out", "{tmp}"], "is a directory"),
        (["--timeout", "nan"], "--timeout"),
        (["--gpu", "FOO"], "unknown GPU"),
    ],
    ids=["out-directory", "timeout-nan", "gpu-unknown"],
)
def test_through_the_console_entry(tmp_path, args, words):
    """`python -m planner probe`: exit 2, one line on stderr, no traceback, no temp dir."""
    temp_root = tmp_path / "tmp"
    temp_root.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "planner",
            "probe",
            *CPU_RUN,
            *(a.format(tmp=tmp_path) for a in args),
        ],
        env=probe_env(TMPDIR=str(temp_root)),
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert words in result.stderr and "Traceback" not in result.stderr
    assert not list(temp_root.iterdir())


@pytest.mark.parametrize("flags", [["--rdzv-endpoint", "{host}:29400"], ["--master-addr", "{host}", "--node-rank", "0"]])
def test_a_rendezvous_host_that_does_not_resolve_is_refused_before_the_launch(flags, no_launch):
    """torchrun waited for it until --timeout and said a node never joined. A label of 64
    characters is refused by the resolver itself (no DNS query, as CI has none)."""
    host = "a" * 64 + ".example"
    line = refused("--nnodes", "2", "--run", *(f.format(host=host) for f in flags))
    assert line.startswith(f"plan probe: {flags[0]} {host}") and "does not resolve on this node" in line


def test_out_and_merge_into_one_file_is_refused(tmp_path, no_launch):
    """Both would be written to it, the second over the first (a critical read)."""
    path = write_profile(tmp_path / "p.yaml")
    line = refused("--merge-into", str(path), "--out", str(path))
    assert line.startswith(f"plan probe: --out {path}: the same file as --merge-into"), line
    assert not no_launch
