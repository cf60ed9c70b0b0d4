"""Vision building blocks on CPU: the registry's models, LAMB, and the seeded input pipeline."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training.common.lamb import Lamb
from training.common.sampling import StepSampler
from training.registry import REGISTRY, load
from training.vision.data import ClassFolder, SeededImages, StepBatches, train_transform
from training.vision.models import build_model, parameter_groups
from training.vision.synthetic import SyntheticTree, write_tree

VISION = sorted(name for name, entry in REGISTRY.items() if entry.family == "vision")


def test_every_registry_vision_model_has_a_builder_and_its_published_parameter_count():
    assert VISION == ["efficientnet-b7", "resnet-tiny", "resnet50"]
    for name in VISION:
        arch = REGISTRY[name].arch
        model = build_model(name, arch.num_classes)
        assert callable(load(REGISTRY[name].builder)), name  # the builder the registry names, imported
        assert sum(p.numel() for p in model.parameters()) == arch.parameters, name


def test_a_language_model_is_not_built_as_a_vision_model():
    with pytest.raises(ValueError, match="'llama2-tiny' is a decoder model, not a vision model"):
        build_model("llama2-tiny", 10)


@pytest.mark.parametrize("name", ["resnet50", "efficientnet-b7"])
def test_full_size_models_run_a_forward_backward_step_at_small_resolution(name):
    torch.manual_seed(0)
    model = build_model(name, num_classes=10)
    optimizer = torch.optim.SGD(parameter_groups(model, 1e-4), lr=0.1, momentum=0.9, nesterov=True)
    images, labels = torch.randn(2, 3, 64, 64), torch.tensor([1, 7])
    before = [p.detach().clone() for p in model.parameters()]
    loss = F.cross_entropy(model(images), labels, label_smoothing=0.1)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and loss.item() > 0
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    changed = sum(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    # Every weight moves; EfficientNet's stochastic depth may zero a dropped block's bias gradients.
    assert changed >= 0.95 * len(before), (changed, len(before))


def test_weight_decay_only_on_conv_and_linear_weights():
    decay, exempt = parameter_groups(build_model("resnet-tiny", 10), 1e-4)
    assert all(p.ndim == 4 or p.ndim == 2 for p in decay["params"]) and decay["weight_decay"] == 1e-4
    assert all(p.ndim == 1 for p in exempt["params"]) and exempt["weight_decay"] == 0.0 and not exempt["adapt"]


def test_lamb_step_matches_the_paper_update():
    w = torch.tensor([3.0, 4.0], requires_grad=True)  # ||w|| = 5
    w.grad = torch.tensor([0.5, -1.0])
    Lamb([w], lr=0.1, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01).step()
    # First step: bias-corrected m = g, v = g^2, so r = g / (|g| + eps) ~ sign(g).
    g = torch.tensor([0.5, -1.0])
    r = g / (g.abs() + 1e-6)
    u = r + 0.01 * torch.tensor([3.0, 4.0])
    expected = torch.tensor([3.0, 4.0]) - 0.1 * (5.0 / u.norm()) * u
    assert torch.allclose(w.detach(), expected, atol=1e-6)


def test_lamb_without_adaptation_is_adam_like_and_zero_weights_use_trust_one():
    for adapt, start in ((False, [3.0, 4.0]), (True, [0.0, 0.0])):
        w = torch.tensor(start, requires_grad=True)
        w.grad = torch.tensor([0.5, -1.0])
        Lamb([{"params": [w], "adapt": adapt}], lr=0.1).step()
        assert torch.allclose(w.detach() - torch.tensor(start), torch.tensor([-0.1, 0.1]), atol=1e-5)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return write_tree(tmp_path_factory.mktemp("img") / "t", SyntheticTree(classes=3, per_class=4, val_per_class=2))


def test_augmentation_depends_only_on_epoch_and_image(tree):
    folder = ClassFolder(str(tree / "train"), classes=["n00000000", "n00000001", "n00000002"])
    folder.transform = train_transform(32)
    images = SeededImages(folder, seed=3)
    torch.manual_seed(123)  # whatever the process RNG holds
    first = images[(0, 5)][0]
    torch.manual_seed(456)
    assert torch.equal(images[(0, 5)][0], first)
    assert not torch.equal(images[(1, 5)][0], first)  # a new epoch, a new crop


def test_val_with_a_subset_of_classes_keeps_the_train_labels(tree, tmp_path):
    val = tmp_path / "val"
    (val / "n00000002").mkdir(parents=True)
    source = next((tree / "val" / "n00000002").iterdir())
    (val / "n00000002" / source.name).write_bytes(source.read_bytes())
    folder = ClassFolder(str(val), classes=["n00000000", "n00000001", "n00000002"])
    assert folder.class_to_idx == {"n00000002": 2} and folder.targets == [2]


def test_step_batches_follow_the_step_sampler_from_any_start():
    sampler = StepSampler(12, global_batch=4, micro_batch=1, rank=1, world=2, seed=0)
    batches = list(StepBatches(sampler, start=2, end=5))
    assert len(batches) == len(StepBatches(sampler, 2, 5)) == 6  # 3 steps x 2 micro batches
    expected = [[(sampler.epoch_of(s), int(i)) for i in m] for s in range(2, 5) for m in sampler.micro_batches(s)]
    assert batches == expected
    assert {epoch for batch in batches for epoch, _ in batch} == {0, 1}  # 3 steps per epoch


def test_efficientnet_b7_under_ddp_on_gpus_syncs_its_batchnorm_and_resnet50_does_not():
    """Issue 50: the B7 recipe's 8 images per GPU are too few for BatchNorm's statistics, and accumulation does not
    add to them: under DDP on GPUs its BatchNorm layers become SyncBatchNorm. ResNet50's 128 per GPU need not, nor
    does one rank, nor CPU ranks (torch's SyncBatchNorm refuses CPU tensors)."""
    from training.vision.models import SYNC_BATCHNORM_BELOW, synced_batchnorm
    from trainkit.job.models import get_model

    def norms(model) -> dict[str, int]:
        kinds = [type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        return {kind: kinds.count(kind) for kind in set(kinds)}

    gpu = torch.device("cuda", 0)
    b7_micro = get_model("efficientnet-b7").recipe.micro_batch_size
    assert b7_micro < SYNC_BATCHNORM_BELOW <= get_model("resnet50").recipe.micro_batch_size
    model = build_model("efficientnet-b7", 1000)
    before = norms(model)
    assert synced_batchnorm(model, b7_micro, 1, gpu) is None and norms(model) == before
    assert synced_batchnorm(model, b7_micro, 8, torch.device("cpu")) is None and norms(model) == before
    said = synced_batchnorm(model, b7_micro, 8, gpu)
    assert said == "synced across 8 ranks (8 images per GPU, below 32)"
    assert norms(model) == {"SyncBatchNorm": before["BatchNorm2d"]}
    resnet = build_model("resnet50", 1000)
    assert synced_batchnorm(resnet, get_model("resnet50").recipe.micro_batch_size, 8, gpu) is None
    assert "SyncBatchNorm" not in norms(resnet)
