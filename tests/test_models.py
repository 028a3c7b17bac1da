"""Models build for every input shape the data sets produce and are seeded."""

import pytest
import torch

from polyrhythm.flat import FlatParameters, shard_ranges
from polyrhythm.models import MODELS
from polyrhythm.models.build import build_model


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(1, 28, 28), (1, 8, 8), (3, 32, 32), (20,), (2, 3, 3)])
def test_models_map_any_sample_shape_to_class_logits(name, shape):
    model = build_model(name, shape, 7, seed=0)
    assert model(torch.zeros(5, *shape)).shape == (5, 7)


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
