"""Extract an engine's accepted command-line flags, their choices and the startup pairings the
planner's commands must satisfy, from the engine's own source at a named version, into the small
JSON file the tests check every emitted command against (tests/engine_flags/ENGINE-VERSION.json).

    python tools/engine_flags.py vllm /path/to/unpacked-wheel-or-checkout
    python tools/engine_flags.py sglang /path/to/sglang-checkout/python
    python tools/engine_flags.py megatron /path/to/Megatron-LM --ref core_v0.19.0
    python tools/engine_flags.py torchrun /path/to/site-packages

SOURCE is a directory holding the engine's package (an unpacked wheel, a site-packages folder,
or a checkout; for SGLang the checkout's python/ folder), or, with --ref, a git repository read
at that ref (`git show REF:PATH`, nothing checked out). Nothing is imported or run: the files
are parsed (ast) and searched (regular expressions), so the engine's dependencies need not be
installed. What is read:

- `add_argument("--flag", "--alias", ..., choices=[...])` calls with literal names in the
  engine's argument files; choices given as a literal list or the name of a module-level list;
- vLLM: `add_argument("--flag", **xxx_kwargs["field"])` with `xxx_kwargs = get_kwargs(Config)`:
  the field's annotation in vllm/config/*.py gives `choices` (a Literal, or a Literal alias),
  and a bool field also accepts `--no-flag` (argparse.BooleanOptionalAction);
- Megatron-LM (core_v0.16+): `ArgumentGroupFactory(Config, exclude=[...])` turns each dataclass
  field of Config (and its bases) into `--field-name` (a bool defaulting to True into
  `--no-field-name` and `--disable-field-name`), or into the names of its argparse_meta;
- the pairings: each is a pattern in a named file; a pattern that no longer matches stops the
  tool with the file it looked in, so a change of an engine's startup checks is seen, not missed.

A flag built in a loop from computed names is not listed (the emitters use none).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ENGINE_FILES = {
    "vllm": ("vllm/engine/arg_utils.py", "vllm/entrypoints/common/cli_args.py",
             "vllm/entrypoints/openai/cli_args.py"),
    "sglang": ("sglang/srt/server_args.py",),
    "megatron": ("megatron/training/arguments.py",),
    "torchrun": ("torch/distributed/run.py",),
}
CONFIG_DIRS = {"vllm": ("vllm/config", "vllm/model_executor/layers/quantization/__init__.py"),
               "megatron": ("megatron/core", "megatron/training")}


@dataclass(frozen=True)
class Pairing:
    """A startup check the planner's commands must satisfy, and the source text showing it."""

    name: str
    path: str | tuple[str, ...]
    """The file holding the check, or the files it has lived in (the first that matches)."""
    pattern: str
    """A regular expression (re.S) that matches while the check is there."""
    value: object = True
    """What the JSON records when it matches (a value read from the match if a callable)."""


SGLANG_CHECKS = ("sglang/srt/server_args.py", "sglang/srt/arg_groups/validation_hook.py")
SGLANG_MEMORY = ("sglang/srt/server_args.py", "sglang/srt/arg_groups/memory_hook.py")
SGLANG_FIELD_FILES = "sglang/srt/arg_groups/fields"
"""SGLang 0.5.2x: ServerArgs' flags are `A[T, "help"]` / `A[T, Arg(...)]` fields of the
namespace classes here (sglang/srt/arg_groups/arg_utils.py add_cli_args_from_dataclass)."""
SGLANG_CHOICES_FILE = "sglang/srt/arg_groups/choices.py"

PAIRINGS = {
    "vllm": (
        Pairing("online_fp8_quantization_deprecated", "vllm/model_executor/layers/quantization/fp8.py",
                r"Please use `--quantization fp8_per_tensor`", "fp8_per_tensor"),
        Pairing("nnodes_must_divide_world_size", "vllm/engine/arg_utils.py",
                r"world_size\s*%\s*self\.nnodes\s*!=\s*0|world_size\s*%\s*self\.nnodes\s*==\s*0"),
        Pairing("dp_rank_inferred_from_node_rank", "vllm/engine/arg_utils.py",
                r"inferred_data_parallel_rank\s*=\s*\(\s*self\.node_rank\s*\*\s*local_world_size"),
        # V0 (0.6.6.post1): a budget below the max model length starts only with chunked prefill
        Pairing("budget_below_max_model_len_needs_chunked_prefill", "vllm/config.py",
                r"max_num_batched_tokens\s*<\s*self\.max_model_len\s+and\s+not\s+self\.chunked_prefill_enabled"),
    ),
    "sglang": (
        # 0.5.2x moved ServerArgs' checks into sglang/srt/arg_groups/*_hook.py (`cfg.` for `self.`)
        Pairing("dp_size_forbids_multi_node", SGLANG_CHECKS,
                r"(?:self|cfg)\.dp_size\s*>\s*1\s+and\s+(?:self|cfg)\.nnodes\s*!=\s*1"),
        Pairing("nnodes_must_divide_tp_times_pp", SGLANG_CHECKS,
                r"\(\s*(?:self|cfg)\.tp_size\s*\*\s*(?:self|cfg)\.pp_size\s*\)\s*%\s*(?:self|cfg)\.nnodes\s*==\s*0"),
        Pairing("mem_fraction_static_reserve_min_gib_large_gpu", SGLANG_MEMORY,
                r"gpu_mem\s*>\s*60\s*\*\s*1024:\s*reserved_mem\s*=\s*max\(reserved_mem,\s*(\d+)\s*\*\s*1024\)",
                "group1"),
        Pairing("serve_subcommand", "sglang/cli/main.py", r'"serve"'),
    ),
    "megatron": (
        Pairing("tp_requires_cuda_device_max_connections_1", "megatron/training/arguments.py",
                r"os\.environ\.get\('CUDA_DEVICE_MAX_CONNECTIONS'\)\s*==\s*\"1\""),
        Pairing("megatron_fsdp_forbids_cuda_device_max_connections_1", "megatron/training/arguments.py",
                r"if args\.use_megatron_fsdp:.*?os\.environ\.get\('CUDA_DEVICE_MAX_CONNECTIONS'\)\s*!=\s*\"1\""),
        Pairing("megatron_fsdp_requires_ckpt_format", "megatron/training/arguments.py",
                r"if args\.use_megatron_fsdp:.*?args\.ckpt_format\s*==\s*\"(\w+)\"", "group1"),
        Pairing("tp_may_exceed_query_groups", "megatron/core/transformer/transformer_config.py",
                r"self\.tensor_model_parallel_size\s*%\s*self\.num_query_groups\s*!=\s*0"),
    ),
    "torchrun": (),
}
OPTIONAL_PAIRINGS = {"tp_may_exceed_query_groups": False, "online_fp8_quantization_deprecated": None,
                     "nnodes_must_divide_world_size": None, "dp_rank_inferred_from_node_rank": None,
                     "budget_below_max_model_len_needs_chunked_prefill": None}
"""Pairings that some releases lack: recorded as this value instead of stopping the tool (vLLM's
V0 engine has no --nnodes; V1 always chunks prompts). tests/test_engine_flags.py checks that a
release whose flags include --nnodes has both --nnodes pairings."""


class Source:
    """Files of one engine version: a directory, or a git repository at a ref."""

    def __init__(self, root: Path, ref: str | None) -> None:
        self.root, self.ref = root, ref

    def read(self, path: str) -> str | None:
        if self.ref is None:
            file = self.root / path
            return file.read_text(encoding="utf-8") if file.is_file() else None
        done = subprocess.run(["git", "-C", str(self.root), "show", f"{self.ref}:{path}"],
                              capture_output=True, text=True)
        return done.stdout if done.returncode == 0 else None

    def python_files(self, under: str) -> list[str]:
        if under.endswith(".py"):
            return [under]
        if self.ref is None:
            return sorted(str(p.relative_to(self.root)) for p in (self.root / under).rglob("*.py"))
        listing = subprocess.run(["git", "-C", str(self.root), "ls-tree", "-r", "--name-only", self.ref, under],
                                 capture_output=True, text=True, check=True).stdout
        return [p for p in listing.splitlines() if p.endswith(".py")]

    def commit(self) -> str | None:
        if self.ref is None:
            return None
        return subprocess.run(["git", "-C", str(self.root), "rev-parse", f"{self.ref}^{{commit}}"],
                              capture_output=True, text=True, check=True).stdout.strip()


@dataclass
class Flags:
    names: set[str] = field(default_factory=set)
    choices: dict[str, list] = field(default_factory=dict)

    def add(self, names: list[str], choices: list | None) -> None:
        self.names.update(names)
        if choices is not None:
            for name in names:
                self.choices[name] = sorted({str(c) for c in choices})


def literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def module_constants(tree: ast.Module, known: dict[str, list] | None = None) -> dict[str, list]:
    """Module-level NAME = [literals] (or tuple; also annotated, NAME: T = [...]), and NAME =
    [*OTHER, literals], OTHER from this module or `known` (constants imported from elsewhere)."""
    constants: dict[str, list] = dict(known or {})
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target, value = node.targets[0].id, node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            target, value = node.target.id, node.value
        if target is not None:
            values = list_value(value, constants)
            if values is not None:
                constants[target] = values
    return constants


def list_value(node: ast.AST, constants: dict[str, list]) -> list | None:
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if not isinstance(node, ast.List | ast.Tuple):
        return None
    values: list = []
    for element in node.elts:
        if isinstance(element, ast.Starred):
            inner = list_value(element.value, constants)
            if inner is None:
                return None
            values += inner
        else:
            value = literal(element)
            if value is None and not (isinstance(element, ast.Constant) and element.value is None):
                return None
            values.append(value)
    return values


def literal_aliases(trees: list[ast.Module]) -> dict[str, list]:
    """Every `Name = Literal[...]` (possibly `Name: TypeAlias = Literal[...]`) in the trees."""
    aliases: dict[str, list] = {}
    for tree in trees:
        for node in ast.walk(tree):
            target, value = None, None
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target, value = node.targets[0].id, node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                target, value = node.target.id, node.value
            if target and value is not None:
                choices = literal_choices(value, aliases)
                if choices is not None:
                    aliases[target] = choices
    return aliases


def literal_choices(annotation: ast.AST | None, aliases: dict[str, list]) -> list | None:
    """The values of a Literal (or of a named Literal alias) anywhere in an annotation."""
    if annotation is None:
        return None
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", getattr(node.value, "attr", None)) == "Literal":
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            values = [literal(item) for item in items]
            if all(v is not None for v in values):
                return values
        if isinstance(node, ast.Name) and node.id in aliases:
            return aliases[node.id]
    return None


def is_bool(annotation: ast.AST | None) -> bool:
    return annotation is not None and any(isinstance(n, ast.Name) and n.id == "bool" for n in ast.walk(annotation))


def dataclass_fields(classes: dict[str, ast.ClassDef], name: str) -> dict[str, ast.AnnAssign]:
    """Annotated class-body fields of `name` and its bases (bases first, so subclasses win)."""
    node = classes.get(name)
    if node is None:
        return {}
    found: dict[str, ast.AnnAssign] = {}
    for base in node.bases:
        if isinstance(base, ast.Name):
            found.update(dataclass_fields(classes, base.id))
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            found[item.target.id] = item
    return found


def argparse_meta_names(item: ast.AnnAssign) -> list[str] | None:
    """arg_names from field(metadata={"argparse_meta": {"arg_names": [...]}})."""
    for node in ast.walk(item.value) if item.value is not None else ():
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if literal(key) == "arg_names":
                    names = literal(value)
                    return list(names) if isinstance(names, list | tuple) else None
    return None


def field_default(item: ast.AnnAssign) -> object:
    if item.value is None:
        return None
    if isinstance(item.value, ast.Call):
        for keyword in item.value.keywords:
            if keyword.arg == "default":
                return literal(keyword.value)
        return None
    return literal(item.value)


def add_argument_calls(tree: ast.Module, constants: dict[str, list], flags: Flags,
                       kwargs_field: dict[str, tuple[str, str]], fields_of) -> None:
    """Every .add_argument("--x", ...) with literal names in `tree`."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"):
            continue
        names = [literal(a) for a in node.args]
        names = [n for n in names if isinstance(n, str) and n.startswith("-")]
        if not names:
            continue
        choices = None
        for keyword in node.keywords:
            if keyword.arg == "choices":
                choices = list_value(keyword.value, constants)
            elif keyword.arg is None and isinstance(keyword.value, ast.Subscript):
                # **parallel_kwargs["tensor_parallel_size"]: the Config field behind it
                holder = getattr(keyword.value.value, "id", None)
                field_name = literal(keyword.value.slice)
                if holder in kwargs_field and isinstance(field_name, str):
                    annotation = fields_of(kwargs_field[holder], field_name)
                    choices = literal_choices(annotation, fields_of.aliases)
                    if is_bool(annotation):
                        names += ["--no-" + n[2:] for n in names if n.startswith("--")]
        flags.add(names, choices)


def get_kwargs_holders(tree: ast.Module) -> dict[str, str]:
    """`xxx_kwargs = get_kwargs(ConfigClass)` -> {"xxx_kwargs": "ConfigClass"}."""
    holders = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "get_kwargs"
                and node.value.args and isinstance(node.value.args[0], ast.Name)):
            holders[node.targets[0].id] = node.value.args[0].id
    return holders


def factory_groups(tree: ast.Module) -> list[tuple[str, list[str]]]:
    """ArgumentGroupFactory(Config, exclude=X) calls: (Config, the excluded field names); X is a
    literal list or a name assigned a literal list earlier in the same function."""
    groups = []
    for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        local_lists: dict[str, list] = {}
        for node in ast.walk(function):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                values = list_value(node.value, local_lists)
                if values is not None:
                    local_lists[node.targets[0].id] = values
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ArgumentGroupFactory":
                exclude: list[str] = []
                for keyword in node.keywords:
                    if keyword.arg == "exclude":
                        exclude = list_value(keyword.value, local_lists) or []
                groups.append((node.args[0].id, exclude))
    return groups


class FieldIndex:
    """Dataclass fields and Literal aliases of the engine's config modules."""

    def __init__(self, source: Source, dirs: tuple[str, ...]) -> None:
        trees = []
        for under in dirs:
            for path in source.python_files(under):
                text = source.read(path)
                if text is not None:
                    trees.append(ast.parse(text))
        self.classes = {n.name: n for t in trees for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
        self.aliases = literal_aliases(trees)

    def __call__(self, class_name: str, field_name: str) -> ast.AST | None:
        item = dataclass_fields(self.classes, class_name).get(field_name)
        return None if item is None else item.annotation


def factory_flags(index: FieldIndex, groups: list[tuple[str, list[str]]], flags: Flags) -> None:
    """What megatron/training/argument_utils.py ArgumentGroupFactory makes of each field."""
    for class_name, exclude in groups:
        for name, item in dataclass_fields(index.classes, class_name).items():
            if name in exclude:
                continue
            meta = argparse_meta_names(item)
            if meta:
                names = meta
            elif is_bool(item.annotation) and field_default(item) is True:
                names = ["--no-" + name.replace("_", "-"), "--disable-" + name.replace("_", "-")]
            else:
                names = ["--" + name.replace("_", "-")]
            flags.add(names, literal_choices(item.annotation, index.aliases))


def version_of(engine: str, source: Source, ref: str | None) -> str:
    patterns = {"vllm": ("vllm/_version.py", r"__version__\s*=\s*version\s*=\s*'([^']+)'"),
                "sglang": ("sglang/_version.py", r"__version__\s*=\s*version\s*=\s*'([^']+)'"),
                "torchrun": ("torch/version.py", r"__version__\s*=\s*'([^'+]+)")}
    if engine in patterns and ref is None:
        path, pattern = patterns[engine]
        match = re.search(pattern, source.read(path) or "")
        if match:
            return match.group(1)
    if ref is None:
        sys.exit(f"{engine}: no version found; read from a git ref (--ref TAG) instead")
    return ref


def build_commit(engine: str, source: Source) -> str | None:
    """The commit a wheel was built from, where its _version.py records it (vcs-versioning)."""
    match = re.search(r"__commit_id__\s*=\s*commit_id\s*=\s*'([^']+)'", source.read(f"{engine}/_version.py") or "")
    return match.group(1) if match else None


def pairings(engine: str, source: Source) -> dict[str, object]:
    found: dict[str, object] = {}
    for pairing in PAIRINGS[engine]:
        paths = (pairing.path,) if isinstance(pairing.path, str) else pairing.path
        match = next((m for m in (re.search(pairing.pattern, source.read(p) or "", re.S) for p in paths) if m), None)
        if match is None:
            if pairing.name in OPTIONAL_PAIRINGS:
                found[pairing.name] = OPTIONAL_PAIRINGS[pairing.name]
                continue
            sys.exit(f"{engine}: pairing {pairing.name}: /{pairing.pattern}/ not found in {', '.join(paths)}: "
                     "the engine's startup checks changed; read them and update the planner")
        value = pairing.value
        found[pairing.name] = int(match.group(1)) if value == "group1" and match.group(1).isdigit() else (
            match.group(1) if value == "group1" else value)
    return found


def _calls_get_kwargs_of_cls(node: ast.ClassDef) -> bool:
    """`get_kwargs(cls)` (0.33) or `get_kwargs(FrontendArgs)` inside FrontendArgs itself (0.22,
    vllm/entrypoints/openai/cli_args.py FrontendArgs.add_cli_args): its own fields become flags."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "get_kwargs"
               and n.args and isinstance(n.args[0], ast.Name) and n.args[0].id in ("cls", node.name)
               for n in ast.walk(node))


def cls_kwargs_flags(tree: ast.Module, flags: Flags) -> None:
    """vLLM's frontend (vllm/entrypoints/common/cli_args.py, BaseFrontendArgs.add_cli_args):
    `get_kwargs(cls)` then `add_argument(f"--{key.replace('_', '-')}", ...)` for every field of
    the dataclass and its bases (--host, --port, ...); a bool field also takes --no-flag."""
    classes = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    aliases = literal_aliases([tree])

    def loops(name: str) -> bool:
        node = classes.get(name)
        return node is not None and (_calls_get_kwargs_of_cls(node) or any(
            isinstance(b, ast.Name) and loops(b.id) for b in node.bases))

    for name in classes:
        if not loops(name):
            continue
        for field_name, item in dataclass_fields(classes, name).items():
            flag = "--" + field_name.replace("_", "-")
            names = [flag, "--no-" + flag[2:]] if is_bool(item.annotation) else [flag]
            flags.add(names, literal_choices(item.annotation, aliases))


def _arg_keywords(metadata: list[ast.AST]) -> dict[str, ast.AST] | None:
    """The keywords of `Arg(...)` among an A[...]'s metadata ({} for a bare help string), or
    None when the field has no CLI metadata."""
    for item in metadata:
        if isinstance(item, ast.Call) and getattr(item.func, "id", None) == "Arg":
            return {k.arg: k.value for k in item.keywords if k.arg}
        if isinstance(item, ast.Constant) and isinstance(item.value, str) or isinstance(item, ast.JoinedStr):
            return {}
    return None


def annotated_field_flags(tree: ast.Module, constants: dict[str, list], flags: Flags) -> None:
    """SGLang 0.5.2x, add_cli_args_from_dataclass: a field `name: A[T, "help" | Arg(...)]` is
    `--name` (or Arg's cli_name) plus Arg's aliases, unless Arg(no_cli=True); choices are Arg's
    or T's Literal; action=argparse.BooleanOptionalAction adds `--no-name`."""
    aliases = literal_aliases([tree])
    for node in ast.walk(tree):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(node.annotation, ast.Subscript)
                and getattr(node.annotation.value, "id", None) in ("A", "Annotated")
                and isinstance(node.annotation.slice, ast.Tuple)):
            continue
        inner, *metadata = node.annotation.slice.elts
        keywords = _arg_keywords(metadata)
        if keywords is None or literal(keywords.get("no_cli", ast.Constant(False))):
            continue
        cli_name = literal(keywords["cli_name"]) if "cli_name" in keywords else None
        names = [cli_name or "--" + node.target.id.replace("_", "-")]
        names += list(literal(keywords["aliases"]) or []) if "aliases" in keywords else []
        if "BooleanOptionalAction" in ast.unparse(keywords.get("action", ast.Constant(None))):
            names += ["--no-" + n[2:] for n in names]
        choices = list_value(keywords["choices"], constants) if "choices" in keywords else None
        flags.add(names, choices if choices is not None else literal_choices(inner, aliases))


def sglang_field_flags(source: Source, flags: Flags) -> list[str]:
    """The namespace fields' flags (0.5.2x); the files read, none for earlier releases."""
    choices_text = source.read(SGLANG_CHOICES_FILE)
    constants = module_constants(ast.parse(choices_text)) if choices_text else {}
    read = []
    for path in source.python_files(SGLANG_FIELD_FILES) if source.read(SGLANG_CHOICES_FILE) else []:
        tree = ast.parse(source.read(path) or "")
        annotated_field_flags(tree, {**constants, **module_constants(tree)}, flags)
        read.append(path)
    return read


IMPORTED_CONSTANTS = {"vllm": ("vllm/model_executor/layers/quantization/__init__.py",)}
"""Modules whose list constants the argument files use as choices (vLLM 0.6.6.post1:
`choices=[*QUANTIZATION_METHODS, None]`, QUANTIZATION_METHODS imported from here)."""


def extract(engine: str, root: Path, ref: str | None) -> dict[str, object]:
    source = Source(root, ref)
    flags = Flags()
    index = FieldIndex(source, CONFIG_DIRS.get(engine, ()))
    imported: dict[str, list] = {}
    for path in IMPORTED_CONSTANTS.get(engine, ()):
        text = source.read(path)
        imported.update(module_constants(ast.parse(text)) if text else {})
    read = []
    for path in ENGINE_FILES[engine]:
        text = source.read(path)
        if text is None:
            continue
        read.append(path)
        tree = ast.parse(text)
        add_argument_calls(tree, module_constants(tree, imported), flags, get_kwargs_holders(tree), index)
        factory_flags(index, factory_groups(tree), flags)
        if engine == "vllm":
            cls_kwargs_flags(tree, flags)
    if engine == "sglang":
        read += sglang_field_flags(source, flags)
    if not read:
        sys.exit(f"{engine}: none of {', '.join(ENGINE_FILES[engine])} under {root}")
    return {
        "engine": engine,
        "version": version_of(engine, source, ref),
        "source": {"ref": ref, "commit": source.commit() or build_commit(engine, source), "files": read},
        "generated_by": "tools/engine_flags.py",
        "flags": sorted(flags.names),
        "choices": dict(sorted(flags.choices.items())),
        "pairings": pairings(engine, source),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=sorted(ENGINE_FILES))
    parser.add_argument("source", type=Path, help="directory holding the package, or a git repository with --ref")
    parser.add_argument("--ref", help="git tag or commit to read (SOURCE is then a git repository)")
    parser.add_argument("--out", type=Path, help="default: tests/engine_flags/ENGINE-VERSION.json")
    args = parser.parse_args()
    data = extract(args.engine, args.source, args.ref)
    out = args.out or Path(__file__).resolve().parent.parent / "tests" / "engine_flags" / (
        f"{args.engine}-{data['version']}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"{out}: {len(data['flags'])} flags, {len(data['choices'])} with choices, "
          f"pairings {data['pairings']}")


if __name__ == "__main__":
    main()
