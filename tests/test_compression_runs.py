"""Compression in real runs: every byte counted is the compressed message's, for a
parameter-server push and reply, an all-reduce of each algorithm and a gossip exchange; the
all-gather schedules that carry messages which do not add up; and what a run records."""

from __future__ import annotations

import pytest
import torch

import polyrhythm
from helpers import small_config, stored_parameters
from polyrhythm.comm.messages import PUSH_HEADER, REPLY_HEADER
from polyrhythm.compression.wire import extent_of, kept, lowrank_sizes
from polyrhythm.layout import GATHERS
from polyrhythm.strategies.gossip import GOSSIP_HEADER
from test_collectives import simulate
from test_instrumentation import ring_bytes

# mnist5k's cnn
CNN_SHAPES = [(16, 1, 3, 3), (16,), (32, 16, 3, 3), (32,), (64, 1568), (64,), (10, 64), (10,)]
STEPS = 20  # 2 epochs of 10


def test_the_cnns_shapes_are_the_ones_these_sizes_assume(tmp_path):
    summary = polyrhythm.train(small_config(tmp_path, strategy="allreduce", workers=1,
                                            epochs=1, steps_per_epoch=1, compress="fp16"))
    assert summary["parameters"] == sum(torch.Size(s).numel() for s in CNN_SHAPES)


@pytest.mark.parametrize("replies", [False, True])
def test_a_push_and_a_reply_carry_exactly_their_compressed_size(tmp_path, replies):
    # Top-1 % with 32-bit indices and values: 2 % of the dense values, plus the header.
    summary = polyrhythm.train(small_config(tmp_path, strategy="bsp", workers=2,
                                            compress="topk", ratio=0.01,
                                            compress_replies=replies))
    numel = summary["parameters"]
    k = kept(0.01, numel)
    assert abs(2 * k - 0.02 * numel) <= 1  # 1 % of 105,866 values rounds to 1,059
    push = 4 * (PUSH_HEADER + 2 * k)
    reply = 4 * (REPLY_HEADER + (2 * k if replies else numel))
    server, *workers = summary["traffic_per_rank"]
    for w in workers:  # every step's push and the leaving message, all of a push's size
        assert w["bytes_sent"] == (STEPS + 1) * push and w["messages_sent"] == STEPS + 1
        assert w["bytes_received"] == STEPS * reply
    assert server["bytes_sent"] == 2 * STEPS * reply
    assert summary["compression"]["dense_share"] == pytest.approx(2 * k / numel)
    assert summary["compression"]["ratio"] == 0.01  # the setting, beside it
    assert summary["compression"]["compress_replies"] is replies


def ring_words(numel: int, n: int, member: int) -> int:
    """What a ring all-reduce member sends, in values (the instrumentation test's bytes)."""
    return ring_bytes(numel, n, member) // 4


@pytest.mark.parametrize("compressor", ["fp16", "topk", "powersgd"])
def test_a_ring_all_reduce_moves_exactly_the_compressed_sizes(tmp_path, compressor):
    n = 3
    summary = polyrhythm.train(small_config(tmp_path, strategy="ring", workers=n,
                                            batch_size=60, compress=compressor,
                                            **({"rank": 2} if compressor == "powersgd"
                                               else {})))
    numel = summary["parameters"]
    for member, rank in enumerate(summary["traffic_per_rank"]):
        if compressor == "fp16":  # the dense ring's messages in two bytes a value
            assert rank["bytes_sent"] == STEPS * 2 * ring_words(numel, n, member)
            assert rank["messages_sent"] == STEPS * 2 * (n - 1)
        elif compressor == "topk":  # every member's pairs around the ring: N-1 of them
            assert rank["bytes_sent"] == STEPS * (n - 1) * 4 * 2 * kept(0.01, numel)
            assert rank["messages_sent"] == STEPS * (n - 1)
        else:  # two rings: the plain values and the Ps, then the Qs
            plain, p, q = lowrank_sizes(extent_of(0, numel, CNN_SHAPES), 2)
            assert p and q and plain + p + q < numel / 10
            assert rank["bytes_sent"] == STEPS * 4 * (ring_words(plain + p, n, member)
                                                      + ring_words(q, n, member))
        assert rank["native_collective_bytes"] == 0


def test_a_gossip_exchange_carries_exactly_its_compressed_size(tmp_path):
    summary = polyrhythm.train(small_config(tmp_path, strategy="gossip", workers=3,
                                            gossip_p=0.5, compress="topk", ratio=0.01))
    message = 4 * (GOSSIP_HEADER + 2 * kept(0.01, summary["parameters"]))
    traffic = summary["traffic_per_rank"]
    assert sum(r["messages_sent"] for r in traffic) > 3 * 2  # models, not just the DONEs
    for rank in traffic:
        assert rank["bytes_sent"] == rank["messages_sent"] * message
    assert sum(r["bytes_received"] for r in traffic) == sum(r["bytes_sent"] for r in traffic)


@pytest.mark.parametrize("algorithm", ["ring", "tree", "reduce-broadcast"])
@pytest.mark.parametrize("n", range(1, 9))
def test_every_member_gathers_every_chunk(algorithm, n):
    for size in (0, 1, 3, 17):
        chunks = [torch.arange(size, dtype=torch.float32) + 100 * j for j in range(n)]
        buffers = []
        for i in range(n):
            buffer = torch.full((n * size,), -1.0)
            buffer[i * size:(i + 1) * size] = chunks[i]
            buffers.append(buffer)
        transports = simulate(lambda m, i, numel: GATHERS[algorithm](m, i, numel // m),
                              buffers)
        for buffer in buffers:
            assert torch.equal(buffer, torch.cat(chunks) if n * size else buffer)
        if algorithm == "ring":  # each member sends every chunk but its left neighbour's
            assert all(t.counters.bytes_sent == 4 * (n - 1) * size for t in transports)


def test_a_gathered_compressor_gives_the_same_model_whatever_the_algorithm(tmp_path):
    # Top-k's messages are gathered and every member adds them in worker order: Gloo's own
    # all-gather, the ring, the tree and reduce-broadcast deliver the same bits.
    models = [stored_parameters(polyrhythm.train(small_config(
        tmp_path / algorithm, strategy=algorithm, workers=3, threads=1, batch_size=60,
        compress="topk", ratio=0.05)))
        for algorithm in ("allreduce", "ring", "tree", "reduce-broadcast")]
    for other in models[1:]:
        assert torch.equal(models[0], other)
