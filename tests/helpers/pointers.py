"""Stale pointers: repository paths and Python modules that docs, comments, error messages and YAML comments name
but that do not exist (a file moved, a module renamed, and the sentence that points at it stayed).

What counts as a pointer:
- a path that starts with one of the repository's top-level folders (`trainkit/backends/eks/render.py`,
  `terraform/modules/ecr`), or is one of its top-level files (`pyproject.toml`); a placeholder (`<id>`, `{name}`,
  `*`) ends the path there;
- a dotted module name of our packages (`trainkit.backends.eks.pod`, `training.spec.run_folder.RUN_DIR_ENV`): each part
  must be a module, or, after the last module, a name that module defines or imports.

A path counts as found where it exists from the repository's root or from the naming file's folder (a README's
tree of its own folder), or where git ignores it (a file the user or a command makes: terraform.tfvars). Names
that only look like paths are listed in `NOT_PATHS` (Kubernetes label keys, the ECR repositories' names).
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
from pathlib import Path

from training.common.tracking import TAG_NAMES  # MLflow tag names, not modules

PACKAGES = ("trainkit", "training", "observability")
SOURCES = (
    "README.md",
    "Makefile",
    "tasks.py",
    "pyproject.toml",
    ".ci/run",
    "*/README.md",
    "**/*.md",
    "trainkit/**/*.py",
    "training/**/*.py",
    "observability/**/*.py",
    "examples/**/*.py",
    "tests/**/*.py",
    "trainkit/**/*.yaml",
    "training/**/*.yaml",
    "containers/**/Dockerfile",
    "terraform/**/*.tf",
)
SKIPPED = (
    "tests/golden/",
    "tests/schemas/",
    "observability/generated/",
    "tests/helpers/pointers.py",
    "tests/unit/test_pointers.py",  # its planted mistakes
)
# Kubernetes label keys and annotations under the trainkit/ prefix, the ECR repositories trainkit/train and
# trainkit/idle-guard, and the bench's "trainkit/reference" pairs: names, not files.
NOT_PATHS = re.compile(r"trainkit/(?:pool|node-group|subnet|run-id|model|rdzv-id|data-dest|train|idle-guard|reference)")
DOMAIN = re.compile(r"\.(?:org|io|com|dev|net|amazonaws)$")


def top_level(root: Path) -> tuple[set[str], set[str]]:
    """The repository's own top-level folders and files (not what git ignores: runs/, build/, a venv)."""
    folders = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
    folders -= {name.split("/")[0] for name in ignored(root, {f"{name}/x" for name in folders})}
    files = {p.name for p in root.iterdir() if p.is_file() and "." in p.name[1:]}
    return folders | {".ci"}, (files - ignored(root, files)) | {"Makefile"}


def path_pattern(folders: set[str], files: set[str]) -> re.Pattern:
    heads = "|".join(re.escape(f) for f in sorted(folders, key=len, reverse=True))
    tops = "|".join(re.escape(f) for f in sorted(files, key=len, reverse=True))
    # Not inside a longer path or a URL (a slash, a dot or a word character before it).
    return re.compile(rf"(?<![\w/.\-~$])(?:(?:{heads})/[\w./\-]*|(?:{tops})(?![\w/\-]))")


MODULE = re.compile(rf"(?<![\w./\-])(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+")


def source_files(root: Path) -> list[Path]:
    """The repository's own text files (not hidden folders but .ci/, not what git ignores: venvs, build/, runs/)."""
    found = set()
    for pattern in SOURCES:
        found.update(p for p in root.glob(pattern) if p.is_file())
    names = {
        str(p.relative_to(root))
        for p in found
        if not any(part.startswith(".") and part != ".ci" for part in p.relative_to(root).parts)
        and "node_modules" not in p.parts
    }
    names = {name for name in names if not any(name.startswith(s) for s in SKIPPED)}
    return sorted(root / name for name in names - ignored(root, names))


def _clean(path: str) -> str:
    path = path.rstrip(".,;:)")
    return path.rstrip("/") or path


@functools.cache
def _defined(module_file: Path) -> frozenset[str]:
    names = set()
    for node in ast.parse(module_file.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def name_exists(root: Path, dotted: str) -> bool:
    """The module part exists, and the first name after it is one that module defines or imports."""
    parts = dotted.split(".")
    here = root
    for index, part in enumerate(parts):
        package = here / part
        if package.is_dir() and (package / "__init__.py").is_file():
            here = package
            continue
        module = here / f"{part}.py"
        if module.is_file():
            rest = parts[index + 1 :]
            return not rest or rest[0] in _defined(module) or rest[0] == "py"
        if index == 0:
            return False
        return part in _defined(here / "__init__.py") or part in {"py", "md", "json", "yaml"}
    return True


def ignored(root: Path, paths: set[str]) -> set[str]:
    """Those of `paths` the root .gitignore ignores, matched in-process as git matches its plain patterns (a pattern
    with an inner slash is anchored at the root; one without matches any path component; a trailing slash, folders;
    no negations, which the file does not use)."""
    gitignore = root / ".gitignore"
    lines = gitignore.read_text().splitlines() if gitignore.is_file() else []
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "a negated .gitignore pattern: teach ignored() about it"

    def matches(path: str) -> bool:
        parts = path.split("/")
        for pattern in patterns:
            folder_only, bare = pattern.endswith("/"), pattern.strip("/")
            if "/" in bare:
                if fnmatch.fnmatchcase(path, bare) or path.startswith(bare + "/"):
                    return True
                continue
            candidates = parts[:-1] if folder_only else parts
            if any(fnmatch.fnmatchcase(part, bare) for part in candidates):
                return True
        return False

    return {path for path in paths if matches(path)}


def stale_pointers(root: Path, files: list[Path] | None = None) -> list[str]:
    """'file:line: pointer' for each pointer that names nothing in the repository."""
    folders, tops = top_level(root)
    paths = path_pattern(folders, tops)
    missing: list[tuple[str, str]] = []
    for file in files if files is not None else source_files(root):
        where = str(file.relative_to(root))
        for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
            for match in paths.finditer(line):
                pointer = _clean(match.group(0))
                if line[match.end() : match.end() + 1] in ("<", "{", "*", "$") or NOT_PATHS.fullmatch(pointer):
                    continue  # a placeholder follows: a pattern of names, not one path
                if line[: match.start()].endswith("no "):
                    continue  # a file said to be absent ("assumed; no benchmarks/llama2-7b-a100.json")
                if not (root / pointer).exists() and not (file.parent / pointer).exists():
                    missing.append((f"{where}:{number}", pointer))
            for match in MODULE.finditer(line):
                dotted = match.group(0).rstrip(".")
                if not DOMAIN.search(dotted) and not name_exists(root, dotted) and dotted not in TAG_NAMES:
                    missing.append((f"{where}:{number}", dotted))
    skip = ignored(root, {pointer for _, pointer in missing if "/" in pointer})
    return [f"{place}: {pointer}" for place, pointer in missing if pointer not in skip]


INVOKE = re.compile(r"(?<!from )\binvoke ([a-z][\w.-]*)((?:[^`#|;&)]|&(?!&))*)")
FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")
GLOBAL_FLAGS = {"help", "list", "complete", "version", "echo", "dry", "debug", "search-root", "collection"}


def task_flags() -> dict[str, set[str]]:
    """Every task's flags, as Invoke derives them from the task's parameters."""
    from trainkit.cli import namespace
    from trainkit.cli.options import task_arguments

    return {
        name: {n for argument in task_arguments(namespace[name]) for n in argument.names if len(n) > 1}
        for name in namespace.task_names
    }


def unknown_flags(root: Path, files: list[Path] | None = None, tasks: dict[str, set[str]] | None = None) -> list[str]:
    """'file:line: invoke TASK --flag' for each flag written after `invoke TASK` that the task does not take (or a
    task that does not exist). Flags after a bare `--` belong to the user's script."""
    tasks = task_flags() if tasks is None else tasks
    found = []
    for file in files if files is not None else source_files(root):
        where = str(file.relative_to(root))
        for number, line in enumerate(file.read_text(errors="replace").splitlines(), 1):
            for match in INVOKE.finditer(line):
                task, rest = match.group(1).rstrip("."), match.group(2)
                if task not in tasks:
                    # A collection (`invoke data`) or a word of prose is no command; a dotted name or one given
                    # flags is.
                    collection = any(name.startswith(f"{task}.") for name in tasks)
                    if not collection and ("." in task or FLAG.search(rest)):
                        found.append(f"{where}:{number}: invoke {task} (no such task)")
                    continue
                rest = rest.split(" -- ")[0]
                for flag in FLAG.findall(rest):
                    if flag not in tasks[task] and flag not in GLOBAL_FLAGS:
                        found.append(f"{where}:{number}: invoke {task} --{flag}")
    return found


def main() -> int:
    """`python -m tests.helpers.pointers`: print every stale pointer and unknown flag; exit 1 when there is one."""
    root = Path(__file__).resolve().parents[2]
    found = [*stale_pointers(root), *unknown_flags(root)]
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
