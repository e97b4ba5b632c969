"""Record the fields of torchtitan's job config at one git tag: every TOML section (JobConfig's
nested dataclasses, dotted: quantize.linear.float8) with its keys and their annotations, into
tests/engine_flags/torchtitan-TAG.json, which the tests check every emitted key against.

    python tools/torchtitan_fields.py /path/to/torchtitan-checkout --ref v0.2.2

The file torchtitan/config/job_config.py is read at REF with `git show` (nothing checked out)
and parsed with ast; nothing is imported, so torch need not be installed. torchtitan's
ConfigManager (torchtitan/config/manager.py) refuses a TOML key that is not such a field.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

CONFIG_FILE = "torchtitan/config/job_config.py"
ROOT = "JobConfig"


def dataclass_fields(tree: ast.Module) -> dict[str, dict[str, str]]:
    """Class name -> field name -> annotation source, for every class in the module."""
    classes = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {stmt.target.id: ast.unparse(stmt.annotation) for stmt in node.body
                                  if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)}
    return classes


def sections(classes: dict[str, dict[str, str]], name: str, prefix: str = "") -> dict[str, dict[str, str]]:
    """Dotted section -> its scalar keys; a field typed by another dataclass is a sub-section."""
    out: dict[str, dict[str, str]] = {}
    scalars = {}
    for field, annotation in classes[name].items():
        if annotation in classes:
            out.update(sections(classes, annotation, f"{prefix}{field}."))
        else:
            scalars[field] = annotation
    if prefix:
        out[prefix.rstrip(".")] = scalars
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repo", type=Path)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    text = subprocess.run(["git", "-C", str(args.repo), "show", f"{args.ref}:{CONFIG_FILE}"],
                          check=True, capture_output=True, text=True).stdout
    found = sections(dataclass_fields(ast.parse(text)), ROOT)
    data = {"engine": "torchtitan", "version": args.ref, "source": f"{CONFIG_FILE}@{args.ref}",
            "sections": {name: found[name] for name in sorted(found)}}
    out = args.out or Path(__file__).resolve().parent.parent / "tests" / "engine_flags" / f"torchtitan-{args.ref}.json"
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    print(f"{out}: {len(found)} sections", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
