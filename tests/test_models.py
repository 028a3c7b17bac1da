"""Models build for every input shape the data sets produce and are seeded; the papers'
models train on a CIFAR-sized batch, have the parameter counts they declare (for listing
without torch) and the papers publish, and refuse non-image samples in one line."""

import math

import pytest
import torch
from torch import nn

from polyrhythm.cli import main
from polyrhythm.errors import ConfigError
from polyrhythm.flat import FlatParameters
from polyrhythm.layout import shard_ranges
from polyrhythm.models import MODELS
from polyrhythm.models.build import build_model

ANY_SHAPE = {"cnn", "mlp", "linear", "perceptron"}  # the rest need (channels, height, width)
LARGE = {"resnet18", "resnet50"}  # built on 3x32x32 only: they downsample as resnet20 does
CIFAR = (3, 32, 32)

# As published, in parameters for CIFAR-10 (ResNet-18/50 and VGG-16: the usual CIFAR
# variants of the ImageNet networks); within 2 %.
PUBLISHED = {"resnet20": 0.27e6, "resnet32": 0.46e6, "resnet56": 0.85e6, "resnet18": 11.2e6,
             "resnet50": 23.5e6, "vgg16": 14.7e6}


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(("name", "shape"), [
    (name, shape) for name in sorted(set(MODELS) - LARGE)
    for shape in [(1, 28, 28), (1, 8, 8), (2, 3, 3), *([(20,)] if name in ANY_SHAPE else [])]])
def test_models_map_any_sample_shape_to_class_logits(name, shape):
    model = build_model(name, shape, 7, seed=0)  # on 3x32x32: test_every_model_trains_...
    with torch.no_grad():
        assert model(torch.zeros(5, *shape)).shape == (5, 7)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_trains_on_a_cifar_batch(name):
    model = build_model(name, CIFAR, 10, seed=0)
    torch.manual_seed(0)
    x, y = torch.randn(2, *CIFAR), torch.tensor([3, 7])
    logits = model(x)
    assert logits.shape == (2, 10)
    nn.functional.cross_entropy(logits, y).backward()
    for key, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), key
    assert parameter_count(model) == MODELS[name].parameters, "its declared count"


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_are_the_published_ones(name):
    assert math.isclose(MODELS[name].parameters, PUBLISHED[name], rel_tol=0.02), name
    assert MODELS["resnet18"].parameters == 11_173_962  # the standard CIFAR ResNet-18


def test_resnets_have_the_papers_depth():
    # 6n + 2 weighted layers: convolutions and the linear one (option A shortcuts have none)
    for depth in (20, 32, 56):
        model = build_model(f"resnet{depth}", CIFAR, 10, seed=0)
        layers = [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
        assert len(layers) == depth


@pytest.mark.parametrize("name", sorted(set(MODELS) - ANY_SHAPE))
def test_image_models_refuse_non_image_samples_in_one_line(name):
    with pytest.raises(ConfigError) as error:
        build_model(name, (64,), 10, seed=0)
    assert str(error.value) == (f"model {name} needs image samples (channels, height, "
                                "width); dataset gives shape (64,)")


def test_models_lists_each_models_size_without_building_it(capsys):
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    resnet20 = next(line for line in lines if line.startswith("resnet20 "))
    assert "0.27 M parameters" in resnet20 and "1.1 MB" in resnet20
    assert resnet20.endswith("[He et al. 2016, Deep Residual Learning for Image Recognition]")
    assert "11.17 M parameters,  44.7 MB" in next(x for x in lines if x.startswith("resnet18"))
    assert lines[-1] == "(parameter counts and float32 sizes for a 3x32x32 sample and 10 " \
                        "classes)"
    assert main(["datasets"]) == 0
    assert "parameters," not in capsys.readouterr().out


def test_same_seed_same_weights():
    a, b, c = (build_model("cnn", (1, 8, 8), 10, seed=s).state_dict() for s in (1, 1, 2))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_flat_parameters_are_views_of_one_buffer():
    model = build_model("mlp", (1, 8, 8), 10, seed=0)
    flat = FlatParameters(model)
    assert len(flat) == sum(p.numel() for p in model.parameters())
    flat.data.zero_()
    assert all((p == 0).all() for p in model.parameters())


@pytest.mark.parametrize(("numel", "shards"), [(10, 3), (5, 5), (3, 4), (1000, 1)])
def test_shard_ranges_cover_the_buffer_contiguously_and_evenly(numel, shards):
    ranges = shard_ranges(numel, shards)
    assert ranges[0][0] == 0 and ranges[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1
