"""Fixtures and hooks for the whole suite; the helpers they use live in tests/helpers.

The suite has three layers, one folder and one marker each (registered in pyproject.toml):

    tests/unit          unit         in-process only: no subprocess, no server, no network (tests/unit/conftest.py
                                     makes starting a process fail); the whole layer in under a minute
    tests/integration   integration  real tools and servers: invoke commands that do not train, terraform,
                                     promtool, moto, kubernetes-validate, a local Kubernetes API, checkov, trivy
    tests/e2e           e2e, slow    real training processes: torchrun jobs, chaos and elastic scenarios, the
                                     infra round trip over the AWS emulator

The markers come from the folder (pytest_collection_modifyitems below), so `-m unit` and `tests/unit` select
the same tests. `slow` is kept as another name for e2e: `-m 'not slow'` still leaves every training run out.
Fixtures used by one layer live in that layer's conftest.py; those shared across layers live here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import chaos_bench, image_build, infra_round_trip, train_bench
from tests.helpers.eks import ECR
from tests.helpers.kube_api import FakeCluster
from tests.helpers.product import stop_started
from training.vision.synthetic import SyntheticTree, write_tree
from trainkit.infra import outputs
from trainkit.paths import STATE_ENV
from trainkit.plan.prices import OFFLINE_ENV

# No test asks AWS for a price: the launcher and every process it starts price from the shipped table, even where a
# developer's credentials are in the environment. A test that wants the Price List API points boto3 at its stand-in
# (tests/helpers/pricing_standin.py), whose env() says so.
os.environ.setdefault(OFFLINE_ENV, "table")

LAYERS = ("unit", "integration", "e2e")
ALIASES = {"e2e": ("slow",)}  # the marker the training runs had before the layers


def pytest_collection_modifyitems(config, items):
    """Mark every test with its layer's marker, from the folder it is in; a test outside the layers is an error."""
    tests = Path(__file__).parent
    outside = []
    for item in items:
        folder = item.path.relative_to(tests).parts[0] if item.path.is_relative_to(tests) else None
        if folder not in LAYERS:
            outside.append(item.nodeid)
            continue
        for name in (folder, *ALIASES.get(folder, ())):
            item.add_marker(name)
    if outside:
        raise pytest.UsageError(
            f"tests outside the layers ({', '.join(f'tests/{layer}' for layer in LAYERS)}): {', '.join(outside)}"
        )
    # Layer by layer (unit, integration, e2e): the background set-ups below start with the first test outside the
    # unit layer and are heavy early, so the integration layer (one process at a time) runs beside them and e2e's
    # two-process training jobs after, when the cores are freer. Last, the modules that wait for what runs in the
    # background.
    order = {layer: index for index, layer in enumerate(LAYERS)}
    items.sort(key=lambda item: (_module(item) in BACKGROUND, order[_module(item).split("/")[0]]))


def _module(item) -> str:
    """The test's module as a path under tests/ (`e2e/test_chaos.py`): file names repeat across the layers."""
    return item.path.relative_to(Path(__file__).parent).as_posix()


# Set-ups that run in the background beside the rest of the suite (tests/helpers/background.py): the module
# whose tests read it -> (start, remove).
BACKGROUND = {
    chaos_bench.MODULE: (chaos_bench.start, lambda started: started.remove()),
    image_build.MODULE: (image_build.start, image_build.remove),
    infra_round_trip.MODULE: (infra_round_trip.start, lambda started: started.remove()),
    train_bench.MODULE: (train_bench.start, lambda started: started.remove()),
}
STARTED = pytest.StashKey[dict]()


WANTED = pytest.StashKey[list]()


def pytest_collection_finish(session):
    """Note the background set-ups whose tests are among those selected; they start with the first test outside
    the unit layer (below), so the unit layer, first and in-process, runs on a quiet machine."""
    session.config.stash[STARTED] = {}
    wanted = sorted({_module(item) for item in session.items} & set(BACKGROUND))
    session.config.stash[WANTED] = [] if session.config.option.collectonly else wanted


def pytest_runtest_setup(item):
    if _module(item).startswith("unit/"):
        return
    started, wanted = item.config.stash[STARTED], item.config.stash[WANTED]
    while wanted:
        module = wanted.pop(0)
        try:
            started[module] = BACKGROUND[module][0]()
        except Exception as error:  # noqa: BLE001 - kept for the tests that read it, not this unrelated one
            started[module] = error


def _started(request, module: str):
    """What BACKGROUND started for `module`; a start that failed fails the tests that read it, with its error."""
    started = request.config.stash[STARTED][module]
    if isinstance(started, Exception):
        raise RuntimeError(f"the background set-up of tests/{module} did not start: {started!r}") from started
    return started


def pytest_terminal_summary(terminalreporter, config):
    """How long each background set-up ran (the suite's record, docs/generate.py --suite-log, reads these lines)."""
    for started in config.stash.get(STARTED, {}).values():
        if getattr(started, "seconds", None) is not None:
            terminalreporter.write_line(f"background {started.name}: {started.seconds:.0f} s")


def pytest_sessionfinish(session):
    for module, started in session.config.stash.get(STARTED, {}).items():
        if not isinstance(started, Exception):
            BACKGROUND[module][1](started)


@pytest.fixture(scope="session")
def chaos_matrix(request):
    """(result, record, table file) of the background `invoke bench elastic` (tests/helpers/chaos_bench.py)."""
    return chaos_bench.result(_started(request, chaos_bench.MODULE))


@pytest.fixture(scope="session")
def infra_round_trip_record(request):
    """What each step of the background `make up` / `infra.outputs` / `make down` against the AWS emulator did
    (tests/helpers/infra_round_trip.py)."""
    return infra_round_trip.result(_started(request, infra_round_trip.MODULE))


@pytest.fixture(scope="session")
def train_bench_pair(request):
    """(result, folder) of the background `invoke bench train` pair (tests/helpers/train_bench.py)."""
    return train_bench.result(_started(request, train_bench.MODULE))


@pytest.fixture(scope="session")
def training_image(request):
    """(buildah's environment, the build's folder, the build's result) of the background image build
    (tests/helpers/image_build.py)."""
    started = _started(request, image_build.MODULE)
    return image_build.buildah_env(started.root), started.root, started.result()


@pytest.fixture(autouse=True, scope="session")
def state_outside_the_checkout(tmp_path_factory):
    """The launcher's state (`.trainkit`: recorded infra outputs, SageMaker and Batch submissions) goes to a folder
    of the session's, not into the checkout, where a developer's own commands would then find a fake stack; a test
    that needs its own sets TRAINKIT_STATE_DIR itself."""
    if STATE_ENV not in os.environ:
        os.environ[STATE_ENV] = str(tmp_path_factory.mktemp("state"))
    yield


@pytest.fixture(autouse=True)
def stop_background_jobs():
    """Whatever a test started with start_invoke and left running is stopped after it (every layer)."""
    yield
    stop_started()


@pytest.fixture
def recorded_outputs(tmp_path, monkeypatch):
    """What `make up PROFILE=aws` records, so nothing depends on this machine."""
    monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
    outputs.save_outputs(
        {
            "gpu_instance_type": "p5.48xlarge",
            "region": "us-east-1",
            "ecr_repository_urls": {"train": ECR},
            "gpu_availability_zone": "us-east-1b",
            "data_reader": {"namespace": "trainkit-jobs", "service_account": "trainkit-data", "buckets": ["datasets"]},
        }
    )


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A local Kubernetes API server with two p5.48xlarge nodes (tests/helpers/kube_api.py), in KUBECONFIG, with the
    platform stack's NetworkPolicies and admission policies (terraform/stacks/platform, as tests/helpers/
    platform_stack.py renders them)."""
    from tests.helpers.platform_stack import manifests

    with FakeCluster(tmp_path / "cluster") as api:
        api.add_nodes("p5.48xlarge", 2, gpus=8, efa=32)
        for _, manifest in manifests():
            if manifest["kind"] == "NetworkPolicy":
                assert api.create_network_policy(manifest["metadata"]["namespace"], manifest)[0] == 201
            if manifest["kind"].startswith("ValidatingAdmissionPolicy"):
                api.admission.append(manifest)
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig()))
        monkeypatch.setenv("TRAINKIT_STATE_DIR", str(tmp_path / "state"))
        yield api


@pytest.fixture
def flat(tmp_path) -> Path:
    """An ILSVRC-shaped tree: train/<wnid>/, flat val/ and LOC_val_solution.csv."""
    return write_tree(tmp_path / "imagenet", SyntheticTree(classes=4, per_class=3, val_per_class=5, flat_val=True))
