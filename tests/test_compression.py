"""The compressors without processes: each codec's bounds, bias and message sizes, error
feedback's bookkeeping, and their state."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from polyrhythm.compression import COMPRESSORS
from polyrhythm.compression.codecs import pack, unpack
from polyrhythm.compression.feedback import ChangeSender, Copy, Encoder
from polyrhythm.compression.wire import (
    CHUNK,
    WORD,
    Extent,
    Matrix,
    all_reduce_parts,
    extent_of,
    payload_words,
)
from polyrhythm.settings import Settings

DEFAULTS = {"ratio": 0.01, "levels": 15, "rank": 4, "warm_start": True}


def codec(name, numel=1000, seed=0, extent=None, **settings):
    values = Settings({**DEFAULTS, **settings})
    return COMPRESSORS[name].build(values, extent or Extent(numel), seed)


def round_trip(c, values):
    out = torch.empty(c.words)
    c.encode(values, out)
    return c.decode(out, torch.empty(c.numel)), out


def test_every_compressor_writes_exactly_the_words_its_arithmetic_sizes():
    torch.manual_seed(0)
    shapes = [(30, 20), (30,), (7, 3, 4)]
    extent = extent_of(0, 600 + 30 + 84, shapes)
    values = torch.randn(extent.numel)
    for name in COMPRESSORS:
        c = codec(name, extent=extent)
        decoded, out = round_trip(c, values)
        assert out.numel() == c.words == payload_words(name, c.settings, extent), name
        assert decoded.shape == values.shape and torch.isfinite(decoded).all(), name
    assert torch.equal(round_trip(codec("none", 714), values)[0], values)


def test_half_precision_round_trips_within_the_formats_bound():
    # Round to nearest: a relative error of at most 2^-11 (binary16) and 2^-8 (bfloat16) for
    # values in the normal range (binary16's: 6.1e-5 to 65504).
    torch.manual_seed(0)
    signs = torch.where(torch.rand(10001) < 0.5, -1.0, 1.0)
    values = signs * torch.logspace(-4, 4.7, 10001) * (1 + torch.rand(10001) * 0.2)
    for name, bound in (("fp16", 2.0**-11), ("bf16", 2.0**-8)):
        decoded, out = round_trip(codec(name, values.numel()), values)
        assert out.numel() == math.ceil(values.numel() / 2)
        relative = ((decoded - values).abs() / values.abs()).max()
        assert 0 < relative <= bound, name


def test_topk_keeps_exactly_the_k_largest_magnitudes():
    values = torch.randperm(10000).float().sub_(5000).mul_(0.001)  # distinct magnitudes
    values[values == 0] = 7.5  # no ties: 0 and -0 aside, every magnitude differs
    c = codec("topk", 10000, ratio=0.01)
    decoded, out = round_trip(c, values)
    largest = set(values.abs().argsort(descending=True)[:100].tolist())
    assert set(decoded.nonzero().view(-1).tolist()) == largest
    assert torch.equal(decoded[list(largest)], values[list(largest)])
    # 1 % with 32-bit indices and values: 2 % of the dense message.
    assert out.numel() * WORD == 0.02 * 10000 * WORD


@pytest.mark.parametrize("name,draws", [("randomk", 20000), ("qsgd", 4000)])
def test_random_k_and_qsgd_are_unbiased(name, draws):
    # The mean of many decoded messages of the same values is the values, within 5 standard
    # errors of each value's own variance, as the codec's draws make it (fixed seeds: the
    # same draws every time): random-k keeps a value with probability k/n and scales it by
    # n/k; QSGD rounds |v|/norm·s up with probability p, its fraction.
    torch.manual_seed(1)
    values = torch.randn(600) * torch.linspace(0.1, 3, 600)
    c = codec(name, 600, seed=3, ratio=0.05, levels=3)
    decoded = torch.stack([round_trip(c, values)[0] for _ in range(draws)]).double()
    v = values.double()
    if name == "randomk":
        variance = v**2 * (600 / c.k - 1)
    else:
        norms = torch.cat([values[:CHUNK].norm().expand(CHUNK),
                           values[CHUNK:].norm().expand(600 - CHUNK)]).double()
        share = v.abs() / norms * 3
        p = share - share.floor()
        variance = (norms / 3) ** 2 * p * (1 - p)
    error = (decoded.mean(0) - v).abs()
    assert (error <= 5 * (variance / draws).sqrt() + 1e-6).all()
    assert decoded.std(0).max() > 0  # random indeed: a biased rounding would pass with none


def test_qsgd_and_signsgd_keep_their_chunk_scales():
    values = torch.randn(2 * CHUNK + 17)
    decoded, _ = round_trip(codec("signsgd", values.numel()), values)
    for a in range(0, values.numel(), CHUNK):
        part = values[a:a + CHUNK]
        assert torch.allclose(decoded[a:a + CHUNK], part.abs().mean() * torch.where(
            part < 0, -1.0, 1.0))
    levels = 7
    decoded, _ = round_trip(codec("qsgd", values.numel(), levels=levels), values)
    for a in range(0, values.numel(), CHUNK):
        part, got = values[a:a + CHUNK], decoded[a:a + CHUNK]
        steps = got.abs() / (part.norm() / levels)  # whole levels of the chunk's norm
        assert torch.allclose(steps, steps.round(), atol=1e-4)
        assert ((got == 0) | (got.sign() == part.sign())).all()
        assert (steps.round() - part.abs() / part.norm() * levels).abs().max() < 1 + 1e-5


@pytest.mark.parametrize("name", ["topk", "signsgd", "powersgd", "qsgd", "randomk", "fp16"])
def test_error_feedback_keeps_exactly_what_was_not_sent(name):
    torch.manual_seed(2)
    extent = extent_of(0, 40 * 30 + 30, [(40, 30), (30,)])
    encoder = Encoder(codec(name, extent=extent, ratio=0.05), feedback=True)
    sent = torch.zeros(extent.numel, dtype=torch.float64)
    given = torch.zeros_like(sent)
    residual = torch.zeros(extent.numel)
    out = torch.empty(encoder.words)
    for _ in range(30):
        gradient = torch.randn(extent.numel)
        encoder.encode(gradient, out)
        decoded = encoder.codec.decode(out, torch.empty(extent.numel))
        # The residual is the gradient (with the last residual) minus what was decoded.
        assert torch.allclose(encoder.residual, gradient + residual - decoded, atol=1e-6)
        residual = encoder.residual.clone()
        sent += decoded.double()
        given += gradient.double()
    # What was sent over T steps plus the final residual is the sum of the gradients.
    # (float32 rounding, relative to the largest value the sums went through)
    scale = max(sent.abs().max(), encoder.residual.abs().max(), given.abs().max())
    assert torch.allclose(sent + encoder.residual.double(), given, atol=1e-5 * scale)
    assert encoder.residual.abs().max() > 0


def test_without_error_feedback_an_encoder_keeps_nothing():
    encoder = Encoder(codec("topk", 100, ratio=0.1), feedback=False)
    out = torch.empty(encoder.words)
    encoder.encode(torch.randn(100), out)
    assert encoder.residual is None


def test_powersgd_recovers_a_low_rank_matrix_and_sends_the_rest_as_it_is():
    torch.manual_seed(3)
    low = torch.randn(64, 2) @ torch.randn(2, 48)  # rank 2
    bias = torch.randn(48)
    tiny = torch.randn(2, 3)  # factors would not halve it: sent as it is
    shapes = [(64, 48), (48,), (2, 3)]
    values = torch.cat([low.view(-1), bias, tiny.view(-1)])
    extent = extent_of(0, values.numel(), shapes)
    c = codec("powersgd", extent=extent, rank=2)
    assert [m for m, _ in c.chosen] == [Matrix(0, 64, 48)]
    for _ in range(3):  # the warm start converges on the matrix's span
        decoded, out = round_trip(c, values)
    assert out.numel() == 48 + 6 + 2 * (64 + 48)
    assert torch.equal(decoded[64 * 48:], values[64 * 48:])
    assert torch.allclose(decoded[:64 * 48], low.view(-1), atol=1e-4)


def test_extents_hold_the_whole_rows_of_a_cut_parameter():
    shapes = [(4, 5), (5,), (3, 2, 2)]  # flat: [0, 20), [20, 25), [25, 37)
    assert extent_of(0, 37, shapes) == Extent(37, (Matrix(0, 4, 5), Matrix(25, 3, 4)))
    # A bucket from 7 to 31 holds rows 2-3 of the first (10..20) and row 0 of the third.
    assert extent_of(7, 31, shapes) == Extent(24, (Matrix(3, 2, 5), Matrix(18, 1, 4)))
    assert extent_of(0, 37) == Extent(37)


def test_an_all_reduce_moves_what_each_compressor_sums_or_gathers():
    s = Settings(DEFAULTS)
    extent = Extent(10000)
    assert all_reduce_parts("fp16", s, extent) == [("sum", 20000)]
    assert all_reduce_parts("randomk", s, extent) == [("sum", 400)]
    assert all_reduce_parts("topk", s, extent) == [("gather", 800)]
    square = extent_of(0, 10000, [(100, 100)])
    assert all_reduce_parts("powersgd", s, square) == [("sum", 1600), ("sum", 1600)]


@pytest.mark.parametrize("name", ["randomk", "qsgd", "powersgd"])
def test_a_codecs_state_carries_its_next_draws(name):
    extent = extent_of(0, 30 * 20, [(30, 20)])
    values = torch.randn(extent.numel)
    first = codec(name, extent=extent, seed=5)
    round_trip(first, values)
    second = codec(name, extent=extent, seed=9)
    second.load_state_dict(first.state_dict())
    assert torch.equal(round_trip(first, values)[1], round_trip(second, values)[1])


def test_a_change_sender_and_the_receivers_copy_stay_equal():
    torch.manual_seed(4)
    initial = torch.randn(300)
    sender = ChangeSender(codec("topk", 300, ratio=0.1), initial)
    receiver = Copy(codec("topk", 300, ratio=0.1), initial)
    model, out = initial.clone(), torch.empty(60)
    for _ in range(50):
        model += 0.01 * torch.randn(300)
        sender.encode(model, out)
        assert torch.equal(receiver.apply(out), sender.copy)
    # What is left out is sent later: with the model still, the copy catches up.
    for _ in range(40):
        sender.encode(model, out)
        receiver.apply(out)
    assert torch.allclose(receiver.values, model, atol=1e-6)


@settings(max_examples=50, deadline=None)
@given(bits=st.integers(1, 16), codes=st.lists(st.integers(0, 2**16 - 1), max_size=100))
def test_packed_codes_unpack_as_they_were(bits, codes):
    codes = torch.tensor([c % (1 << bits) for c in codes], dtype=torch.int32)
    data = pack(codes, bits)
    assert data.numel() == -(-codes.numel() * bits // 8)
    assert torch.equal(unpack(data, bits, codes.numel()), codes)
