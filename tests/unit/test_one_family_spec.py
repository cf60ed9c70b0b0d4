"""A model family is one declaration (training/families.py, issue 51): nothing outside a family's own package keys a
table by a family's name or branches on it, as test_one_model_registry holds the models to one registry; and what
each declaration says agrees with the code it describes."""

from __future__ import annotations

import ast
import re

import pytest

from tests.helpers.imports import import_graph
from tests.helpers.paths import REPO
from training.families import FAMILIES, FORMER_NAMES, family_of
from training.spec import DATA_FORMATS, SHARDING_CHOICES
from training.text import formats

OWN = {"decoder": "training/llm/", "bert": "training/encoder/", "vision": "training/vision/"}
"""Each family's own package, where its code may name it."""
SPEC = "training/families.py"


def _strings(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_strings(element) for element in node.elts))
    return set()


def family_names_used(source: str) -> list[tuple[int, str, set[str]]]:
    """(line, what, names) of each comparison with a family's name on a family, and each table keyed by one."""
    names = set(FAMILIES) | set(FORMER_NAMES.values())
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            used = set().union(_strings(node.left), *(_strings(c) for c in node.comparators)) & names
            if used and "famil" in (ast.get_source_segment(source, node) or ""):
                found.append((node.lineno, "branch", used))
        elif isinstance(node, ast.Dict):
            used = set().union(*(_strings(key) for key in node.keys if key is not None)) & names
            if used:
                found.append((node.lineno, "table", used))
    return found


def test_no_family_keyed_table_or_branch_outside_the_familys_own_modules():
    offenders = []
    for root in ("trainkit", "training", "observability"):
        for path in sorted((REPO / root).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative == SPEC:
                continue
            for line, what, used in family_names_used(path.read_text()):
                if not all(relative.startswith(OWN[name]) for name in used):
                    offenders.append(f"{relative}:{line}: a {what} on {sorted(used)}")
    assert offenders == [], "ask the family (training/families.py) instead:\n" + "\n".join(offenders)


def test_the_check_finds_a_branch_and_a_table():
    source = 'if job.model.family == "vision":\n    pass\nUNITS = {"decoder": 1, "vision": 2}\n'
    assert [(line, what) for line, what, _ in family_names_used(source)] == [(1, "branch"), (3, "table")]


def test_the_sagemaker_metric_of_each_family_reads_its_rate_off_the_progress_line(capsys):
    """SageMaker applies each MetricDefinition's Regex to the training job's log and records the first group as the
    metric's value (API reference, MetricDefinition; Developer Guide, "Define metrics"): each family's rate, as
    ProgressLines prints it under the family's progress name, is what its metric reads."""
    from training.common.progress import ProgressLines, eval_line
    from trainkit.backends.sagemaker.request import LOSS_METRIC, eval_metrics, rate_metric

    for family in FAMILIES.values():
        line = ProgressLines("run-x", start=0, total=10, quiet=False)
        line.set_postfix(loss="2.3102", **{family.throughput.progress: "4301"})
        line.update()
        printed = capsys.readouterr().out
        name, regex = rate_metric(family.throughput)
        assert name == family.throughput.metric and re.search(regex, printed).group(1) == "4301", (family, printed)
        assert re.search(LOSS_METRIC[1], printed).group(1) == "2.3102"
        figures = {name: 1.5 + index for index, name in enumerate(family.eval_metrics)}
        line = eval_line("run-x", 40, figures)
        for name, regex in eval_metrics(family.eval_metrics):
            assert float(re.search(regex, line).group(1)) == figures[name], (family.name, name, line)


def test_each_declaration_agrees_with_the_code_it_describes():
    for family in FAMILIES.values():
        assert set(family.shardings) <= set(SHARDING_CHOICES), family.name
        assert set(family.formats) <= set(DATA_FORMATS) and (family.synthetic_format is None) == (not family.text)
        assert family.synthetic_format is None or family.synthetic_format in family.formats
    assert family_of("decoder").formats == formats.FORMAT_NAMES and family_of("bert").formats == formats.ENCODER_FORMATS
    with pytest.raises(ValueError, match="unknown model family 'mlp'; one of decoder, vision, bert"):
        family_of("mlp")


def loaded_at_import(module: str, graph: dict[str, set[str]]) -> set[str]:
    """The modules importing `module` runs: its imports outside function bodies (`graph`), each one's parent
    packages, transitively."""
    seen, todo = set(), [module]
    while todo:
        parts = todo.pop().split(".")
        for name in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
            if name in graph and name not in seen:
                seen.add(name)
                todo.extend(graph[name])
    return seen


def test_a_worker_imports_its_own_familys_package_and_no_others():
    """A worker starts its family's trainer (training/__main__.py): what that import runs stays out of every other
    family's package (issue 51: BERT's started vision's and the decoders' modules for LAMB and the byte tokenizer)."""
    graph = import_graph(REPO, "training", deferred=False)
    for family in FAMILIES.values():
        loaded = loaded_at_import(family.trainer.partition(":")[0], graph)
        others = {name for name in loaded for own in OWN.values() if name.startswith(own.replace("/", ".").rstrip("."))}
        mine = OWN[family.name].replace("/", ".").rstrip(".")
        assert {name for name in others if not name.startswith(mine)} == set(), family.name


@pytest.fixture
def scratch_registry():
    """What a test registers is gone after it: the families, the models and the loaded modules as they were."""
    from training import families, registry

    saved = dict(families.FAMILIES), dict(registry.REGISTRY), list(families.LOADED)
    yield
    for table, before in zip((families.FAMILIES, registry.REGISTRY, families.LOADED), saved, strict=True):
        table.clear()
        table.update(before) if isinstance(table, dict) else table.extend(before)


def _module(monkeypatch, tmp_path, base: str, body: str) -> str:
    """A module of its own name for each test (Python keeps a module it imported once)."""
    name = re.sub(r"\W", "_", f"{base}_{tmp_path.name}")
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


FAMILY_MODULE = """
from dataclasses import dataclass, replace
from training.families import BERT
from training.registry import REGISTRY
from training.spec.options import option

@dataclass
class Own:
    width: int = option(4, "Toy: width.", minimum=1)

FAMILY = replace(BERT, name="toy", kind="toy", options=Own)
MODELS = (replace(REGISTRY["bert-tiny"], name="toy-tiny", family="toy"),)
"""


def test_a_family_module_registers_its_family_models_and_options_and_spec_json_carries_them(
    scratch_registry, monkeypatch, tmp_path
):
    from training.families import FAMILY_MODULES_ENV, load_family_modules
    from training.registry import REGISTRY
    from training.spec import Job, by_key

    name = _module(monkeypatch, tmp_path, "toy_family_module", FAMILY_MODULE)
    assert "toy" not in FAMILIES and "width" not in by_key()
    monkeypatch.setenv(FAMILY_MODULES_ENV, name)
    assert load_family_modules()[-1:] == [name] and load_family_modules().count(name) == 1  # once
    assert FAMILIES["toy"].kind == "toy" and REGISTRY["toy-tiny"].family == "toy"
    width = by_key()["width"]
    assert (width.flag, width.families, width.path) == ("--width", ("toy",), "toy.width")
    job = Job()
    job.run.family_modules = [name]
    width.set(job, 7)
    written = job.to_dict()
    assert written["toy"] == {"width": 7} and "family_options" not in written
    assert Job.from_dict(written).section("toy").width == 7
    assert Job.from_dict(written).fingerprint() != Job().fingerprint()  # its options change what is trained


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("raise RuntimeError('no GPU driver')", "does not import: RuntimeError: no GPU driver"),
        ("X = 1", "has no FAMILY: declare its training.families.Family under that name"),
        (FAMILY_MODULE.replace('name="toy"', 'name="decoder"'), "model family 'decoder' is declared twice"),
        (FAMILY_MODULE.replace('name="toy"', 'name="my-toy"'), "a family's name is a Python identifier"),
        (FAMILY_MODULE.replace('name="toy-tiny"', 'name="bert-tiny"'), "model 'bert-tiny' is in the registry already"),
        (FAMILY_MODULE.replace('family="toy"', 'family="nope"'), "unknown model family 'nope'"),
    ],
)
def test_a_family_module_that_cannot_be_registered_says_why(scratch_registry, monkeypatch, tmp_path, body, said):
    from training.families import load_family_modules

    name = _module(monkeypatch, tmp_path, "broken_family_module", body)
    with pytest.raises(ValueError, match=re.escape(said)):
        load_family_modules([name])


@pytest.mark.parametrize(
    ("rename", "said"),
    [
        (("width: int", "seed: int"), "a family's option takes the flag of another option: seed"),
        (('"toy"', '"model"'), "model family 'model' takes the name of a spec.json section"),
    ],
)
def test_a_familys_options_may_not_shadow_the_schemas(scratch_registry, monkeypatch, tmp_path, rename, said):
    from training.families import load_family_modules
    from training.spec import all_fields

    name = _module(monkeypatch, tmp_path, "shadowing_family_module", FAMILY_MODULE.replace(*rename))
    load_family_modules([name])
    with pytest.raises(ValueError, match=re.escape(said)):
        all_fields()
