"""The launcher's shape, read from its source with `ast`: no import cycle between any two modules of trainkit/ (nor
of training/ or observability/), counting imports inside functions (a deferred import that closes a cycle still ties
the two modules together)."""

from __future__ import annotations

import ast

import pytest

from tests.helpers.imports import import_graph
from tests.helpers.paths import REPO


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, edges = work[-1]
            child = next(edges, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


@pytest.mark.parametrize("root", ["trainkit", "training", "observability"])
def test_no_import_cycle_between_any_modules_of_a_package(root):
    assert cycles(import_graph(REPO, root)) == []


def test_the_cycle_check_finds_a_planted_cycle_through_a_deferred_import(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .b import x\n")
    (package / "a.py").write_text("from .sub import b\n")
    (package / "sub" / "b.py").write_text("def x():\n    from ..a import y\n    import pkg.c\n")
    (package / "c.py").write_text("import os\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.a", "pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.sub", "pkg.sub.b"]]


def test_no_two_modules_of_trainkit_define_a_class_of_the_same_name():
    """One name, one meaning: two `Workload` classes (the rendered pod's command and the planner's step cost) once
    meant different things in render.py and scaling.py."""
    defined: dict[str, list[str]] = {}
    for path in sorted((REPO / "trainkit").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                defined.setdefault(node.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in defined.items() if len(paths) > 1} == {}


MAX_LINES = 400
MAX_TOP_LEVEL_MODULES = 5


def test_trainkit_is_grouped_by_concern_with_few_small_modules_at_its_top():
    """Code lives in its concern's package (job/, run/, backends/, workloads/, plan/, bench/, infra/ ...); only a
    few small shared modules (errors, paths, the hardware table) sit directly in trainkit/."""
    top = sorted(path.name for path in (REPO / "trainkit").glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_no_module_reaches_the_size_limit():
    """trainkit/, training/ and observability/ alike (issue 51: the job schema had 768 lines in one module)."""
    sizes = {
        str(path.relative_to(REPO)): len(path.read_text().splitlines())
        for root in ("trainkit", "training", "observability")
        for path in (REPO / root).rglob("*.py")
    }
    assert {path: lines for path, lines in sizes.items() if lines > MAX_LINES} == {}


def test_training_imports_nothing_from_the_launcher():
    """What runs inside the job (training/) works without trainkit/ installed: a user's image may hold only it."""
    found = {}
    for path in (REPO / "training").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                bad = [name for name in names if name == "trainkit" or name.startswith("trainkit.")]
                if bad:
                    found.setdefault(str(path.relative_to(REPO)), []).extend(bad)
    assert found == {}


def test_every_folder_of_python_is_a_package_the_wheel_takes():
    """setuptools' `packages.find` takes only folders with an __init__.py: a folder without one would be left out of
    the installed package and fail at import there, never in a checkout."""
    folders = {
        path.parent for root in ("trainkit", "training", "observability") for path in (REPO / root).rglob("*.py")
    }
    assert sorted(str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").is_file()) == []


def target_comparisons(source: str, targets: set[str]) -> list[int]:
    """Lines where code compares something called target with a backend's name (`target == "eks"`,
    `target in ("local", "eks")`): a command that branches on where it runs instead of asking the backend."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        names = {n.id for o in operands for n in ast.walk(o) if isinstance(n, ast.Name)}
        names |= {n.attr for o in operands for n in ast.walk(o) if isinstance(n, ast.Attribute)}
        constants = {n.value for o in operands for n in ast.walk(o) if isinstance(n, ast.Constant)}
        if any("target" in name for name in names) and constants & targets:
            found.append(node.lineno)
    return found


def test_no_command_module_branches_on_the_target():
    """Every command reaches its backend through BACKENDS (trainkit/backends/__init__.py)."""
    from trainkit.backends import BACKENDS

    branches = {
        str(path.relative_to(REPO)): target_comparisons(path.read_text(), set(BACKENDS))
        for path in (REPO / "trainkit" / "cli").glob("*.py")
    }
    assert {path: lines for path, lines in branches.items() if lines} == {}


def test_the_target_check_finds_a_branch_on_the_target():
    source = (
        'def f(target, job):\n    if target == "eks":\n        pass\n    return job.placement.target in ("local",)\n'
    )
    assert target_comparisons(source, {"local", "eks"}) == [2, 4]
    assert target_comparisons('x = name == "eks"\n', {"eks"}) == []


def model_tables(source: str, names: set[str]) -> list[int]:
    """Lines of a table keyed by model names (a dict literal, or a list, tuple or set of them, holding two or
    more): a second place that says which models exist and what each is."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Dict):
            items = node.keys
        elif isinstance(node, ast.List | ast.Tuple | ast.Set):
            items = node.elts
        else:
            continue
        keyed = {item.value for item in items if isinstance(item, ast.Constant) and item.value in names}
        if len(keyed) >= 2:
            found.append(node.lineno)
    return found


def test_one_model_registry():
    """training/registry.py is the only name -> model table: builders, trainers and the launcher's recipes read it
    (two tables keyed by the same names, trainkit's and training/vision's, once had to be kept in step by hand)."""
    from training.registry import REGISTRY

    sources = [
        REPO / "tasks.py",
        *(p for root in ("trainkit", "training", "observability") for p in (REPO / root).rglob("*.py")),
    ]
    tables = {
        str(path.relative_to(REPO)): model_tables(path.read_text(), set(REGISTRY))
        for path in sources
        if path != REPO / "training" / "registry.py"
    }
    assert {path: lines for path, lines in tables.items() if lines} == {}


def test_the_registry_check_finds_a_second_table():
    names = {"resnet50", "resnet-tiny", "llama2-7b"}
    source = 'B = {"resnet50": f, "resnet-tiny": g}\n'
    source += 'VISION = ("resnet50", "resnet-tiny")\nDEFAULT = {"model": "llama2-7b"}\n'
    assert model_tables(source, names) == [1, 2]


def test_the_run_package_never_reaches_up_into_the_backends():
    """trainkit/run/ is what every backend uses to start a run; it imports no backend, deferred imports included
    (issue 51: `Workload` and `ready` moved from backends/base.py to run/workload.py)."""
    graph = import_graph(REPO, "trainkit")
    upward = {
        module: sorted(name for name in imported if name.startswith("trainkit.backends"))
        for module, imported in graph.items()
        if module.startswith("trainkit.run.")
    }
    assert {module: names for module, names in upward.items() if names} == {}
