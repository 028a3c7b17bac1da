"""Decentralised strategies (localsgd, dpsgd, gossip): their pure rules, and real runs."""

import math
import os
from fractions import Fraction
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import polyrhythm
from helpers import equivalence_config, rank_processes, small_config, stored_parameters
from polyrhythm.metrics.store import RunStore
from polyrhythm.strategies.decentralised import (
    gossip_merge,
    gossip_send_share,
    mix,
    mixing_weights,
    ring_neighbours,
)
from polyrhythm.strategies.gossip import (
    DONE,
    GOSSIP_HEADER,
    MODEL,
    decode_gossip,
    encode_gossip,
)
from polyrhythm.strategies.peers import PeerMessages

# --- gossip: the alphas (and the alpha-weighted model mass) are conserved ------------------

# An operation: ("send", i, j): worker i halves its alpha and sends (w_i, share) to j;
# ("deliver", k): the k-th message in flight (mod their number) is merged by its receiver.
operations = st.lists(st.one_of(
    st.tuples(st.just("send"), st.integers(0, 7), st.integers(1, 7)),
    st.tuples(st.just("deliver"), st.integers(0, 100))), max_size=60)


def simulate(n: int, ops, models: list, one):
    """GoSGD on scalar 'models': returns (alphas, models, messages still in flight)."""
    alphas = [one / n] * n
    in_flight = []  # (receiver, w, alpha)
    for op in ops:
        if op[0] == "send":
            i = op[1] % n
            j = (i + op[2]) % n
            if i == j:
                continue
            alphas[i], share = gossip_send_share(alphas[i])
            in_flight.append((j, models[i], share))
        elif in_flight:
            j, w, alpha = in_flight.pop(op[1] % len(in_flight))
            models[j], alphas[j] = gossip_merge(models[j], alphas[j], w, alpha)
    return alphas, models, in_flight


@given(st.integers(1, 6), operations, st.lists(st.integers(-100, 100), min_size=6, max_size=6))
def test_gossip_conserves_alpha_and_weighted_model_exactly(n, ops, initial):
    models = [Fraction(v) for v in initial[:n]]
    mass = sum(models) / n  # sum alpha_i w_i at the start
    alphas, models, in_flight = simulate(n, ops, models, Fraction(1))
    assert sum(alphas) + sum(a for _, _, a in in_flight) == 1
    assert sum(a * w for a, w in zip(alphas, models, strict=True)) + sum(
        a * w for _, w, a in in_flight) == mass
    assert all(a > 0 for a in alphas)
    if not in_flight:  # everything delivered: the consensus is the alpha-weighted mean
        assert sum(a * w for a, w in zip(alphas, models, strict=True)) / sum(alphas) == mass


@given(st.integers(1, 6), operations)
def test_gossip_alphas_sum_to_one_in_floats(n, ops):
    alphas, _, in_flight = simulate(n, ops, [0.0] * n, 1.0)
    assert math.isclose(sum(alphas) + sum(a for _, _, a in in_flight), 1.0, abs_tol=1e-12)


@given(st.floats(min_value=1e-300, max_value=1.0))
def test_gossip_send_share_splits_alpha_exactly(alpha):
    keep, share = gossip_send_share(alpha)
    assert keep + share == alpha and keep > 0 and share > 0


@given(st.floats(min_value=1e-300, max_value=1.0))
def test_gossip_message_carries_alpha_bit_for_bit(alpha):
    w = torch.randn(5)
    kind, decoded, values = decode_gossip(
        encode_gossip(torch.empty(GOSSIP_HEADER + 5), MODEL, alpha, w))
    assert (kind, decoded) == (MODEL, alpha)  # a float32 field would round most alphas
    assert torch.equal(values, w)
    assert decode_gossip(encode_gossip(torch.empty(GOSSIP_HEADER + 5), DONE, 0.0))[0] == DONE


def test_gossip_merge_is_the_alpha_weighted_mean():
    w, alpha = gossip_merge(torch.tensor([0.0, 4.0]), 0.75, torch.tensor([4.0, 0.0]), 0.25)
    assert alpha == 1.0 and torch.equal(w, torch.tensor([1.0, 3.0]))


# --- the messages gossip and TreeEASGD send: their outbox ----------------------------------


class _Sends:
    """A transport's sends, each done only when waited for (as a Gloo send may still be read
    from its tensor until then); what each send's tensor held when it was done."""

    membership = None

    def __init__(self) -> None:
        self.delivered: list[float] = []

    def receiver(self, *args, **kwargs):
        return None

    def isend(self, tensor, rank, tag):
        sends = self

        class Send:
            def wait(self, within=None):
                sends.delivered.append(tensor[0].item())
        return Send()


def test_peer_messages_compose_no_message_over_one_on_its_way():
    """compose() hands out the outbox only once the last message's sends are done: a DONE
    written over a model still being sent reached the peer as that model (gossip's finish,
    a hang under load)."""
    sends = _Sends()
    ctx = SimpleNamespace(transport=sends, config=SimpleNamespace(timeout=30.0))
    messages = PeerMessages(ctx, [], 3, tag=7, is_done=lambda m: m[0] == DONE)
    for kind in (MODEL, MODEL, DONE):
        messages.compose()[0] = kind
        messages.send([1, 2])
    messages.settle()
    assert sends.delivered == [MODEL] * 4 + [DONE] * 2


# --- dpsgd: the ring's mixing matrix --------------------------------------------------------

@pytest.mark.parametrize("n", range(1, 9))
def test_ring_mixing_matrix_is_doubly_stochastic_over_distinct_neighbours(n):
    rows = [mixing_weights(i, n) for i in range(n)]
    for i, row in enumerate(rows):
        assert sum(row.values()) == pytest.approx(1.0, abs=1e-15)
        assert len(row) == min(n, 3)  # itself and its distinct neighbours
        assert set(row) == {i, *ring_neighbours(i, n)}
        assert all(rows[j].get(i) == w for j, w in row.items())  # symmetric
    assert ring_neighbours(0, 1) == [] and ring_neighbours(1, 2) == [0]
    assert ring_neighbours(0, 5) == [1, 4]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_ring_mixing_keeps_equal_models_equal_and_the_mean_in_general(n):
    w = torch.randn(100)
    mixed = [mix(dict.fromkeys(range(n), w), mixing_weights(i, n)) for i in range(n)]
    assert all(torch.equal(m, mixed[0]) for m in mixed)
    assert torch.allclose(mixed[0], w, atol=1e-6)
    models = {i: torch.randn(100) for i in range(n)}
    mixed = [mix(models, mixing_weights(i, n)) for i in range(n)]
    assert torch.allclose(sum(mixed), sum(models.values()), atol=1e-5)


# --- real runs ------------------------------------------------------------------------------

def model_bytes(summary) -> int:
    return summary["parameters"] * 4  # float32


def consensus_bytes(summary) -> int:
    """The all-reduce that makes each epoch's validated model the workers' weighted mean:
    every epoch's model and its float64 weight."""
    return summary["epochs"] * (model_bytes(summary) + 8)


def assert_no_rank_left():
    assert rank_processes(os.getpid()) == {}


def learned(tmp_path, strategy: str, epochs: int, **parameters) -> dict:
    """A real 4-worker run on mnist5k with the cnn; asserts it learned and left no process."""
    summary = polyrhythm.train(strategy=strategy, workers=4, epochs=epochs, out=str(tmp_path),
                               **parameters)
    print(strategy, "final_val_accuracy", summary["final_val_accuracy"])
    assert summary["final_val_accuracy"] >= 0.85
    assert_no_rank_left()
    return summary


def test_localsgd_with_tau_1_equals_allreduce(tmp_path):
    # 3 workers share 64 as 22 + 21 + 21, lr decays each epoch: averaging the models after
    # every local step is all-reduce SGD (the step is linear in gradient and momentum).
    common = {"workers": 3, "batch_size": 64, "seed": 7}
    allreduce = polyrhythm.train(equivalence_config(tmp_path, strategy="allreduce", **common))
    localsgd = polyrhythm.train(equivalence_config(tmp_path, strategy="localsgd", tau=1,
                                                   **common))
    assert (stored_parameters(localsgd) - stored_parameters(allreduce)).abs().max() <= 1e-4
    assert localsgd["weight_updates"] == 20
    assert_no_rank_left()


def test_localsgd_learns_and_averages_every_tau_steps(tmp_path):
    summary = learned(tmp_path, "localsgd", epochs=1, tau=4)
    averagings = math.ceil(summary["per_worker"][0]["steps"] / 4)  # the rest's in finish()
    for rank in summary["traffic_per_rank"]:
        assert rank["native_collective_bytes"] == (averagings * model_bytes(summary)
                                                   + consensus_bytes(summary))
        assert rank["bytes_sent"] == 0


def test_dpsgd_learns_and_sends_its_model_to_both_ring_neighbours_each_step(tmp_path):
    summary = learned(tmp_path, "dpsgd", epochs=1)
    steps = summary["per_worker"][0]["steps"]
    for rank in summary["traffic_per_rank"]:
        assert rank["bytes_sent"] == rank["bytes_received"] == 2 * model_bytes(summary) * steps
        assert rank["messages_sent"] == 2 * steps
        # the final average, then the epochs' consensus
        assert rank["native_collective_bytes"] == model_bytes(summary) + consensus_bytes(summary)
    assert all(w["wait_s"] > 0 for w in summary["per_worker"])
    # Epochs are validated on the workers' mean model, as the stored one: the last matches.
    last = summary["epoch_metrics"][-1]
    assert last["val_accuracy"] == pytest.approx(summary["final_val_accuracy"], abs=0.002)


def test_dpsgd_with_two_workers_exchanges_with_its_one_neighbour(tmp_path):
    summary = polyrhythm.train(small_config(tmp_path, strategy="dpsgd", workers=2, epochs=1))
    for rank in summary["traffic_per_rank"]:
        assert rank["bytes_sent"] == rank["bytes_received"] == model_bytes(summary) * 10
    assert_no_rank_left()


def expected_gossip(n: int, steps: int, p: float, seed: int) -> list[int]:
    """Models each of n workers receives in `steps` steps: worker i draws from a generator
    seeded by (seed, i) whether to send and to which of the others, so the counts are
    reproducible whatever the timing."""
    received = [0] * n
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        others = [j for j in range(n) if j != i]
        for _ in range(steps):
            if rng.random() < p:
                received[others[rng.integers(n - 1)]] += 1
    return received


def gossip_bytes(summary, messages: int) -> int:
    return messages * (model_bytes(summary) + 4 * GOSSIP_HEADER)


def test_gossip_learns_and_loses_no_message(tmp_path):
    summary = learned(tmp_path, "gossip", epochs=2, gossip_p=0.2)
    traffic = summary["traffic_per_rank"]
    sent = sum(r["messages_sent"] for r in traffic)
    assert sum(r["messages_received"] for r in traffic) == sent
    assert sent - 4 * 3 == sum(expected_gossip(4, summary["per_worker"][0]["steps"], 0.2,
                                               seed=0))
    for r in traffic:
        assert r["bytes_sent"] == gossip_bytes(summary, r["messages_sent"])


def test_gossip_drains_every_message_when_workers_finish_at_different_times(tmp_path):
    # Worker 0 is 50 ms slower a step, everyone gossips every step: the others finish early,
    # and their models and DONEs reach worker 0 while it still trains. Whatever the order
    # the machine runs them in, each worker merges every model sent to it (drawn from its
    # peers' seeded coins) and every peer's DONE before the consensus.
    config = small_config(tmp_path, strategy="gossip", workers=3, epochs=1, gossip_p=1.0,
                          worker_delay_s=[0.05, 0, 0])
    summary = polyrhythm.train(config)
    assert [w["steps"] for w in summary["per_worker"]] == [10] * 3
    traffic = sorted(summary["traffic_per_rank"], key=lambda r: r["rank"])
    assert [r["messages_sent"] for r in traffic] == [10 + 2] * 3  # a model a step, 2 DONEs
    models = expected_gossip(3, 10, 1.0, seed=config.seed)
    assert [r["messages_received"] for r in traffic] == [m + 2 for m in models]
    for r in traffic:
        assert r["bytes_received"] == gossip_bytes(summary, r["messages_received"])
    assert_no_rank_left()


def test_dpsgd_told_to_continue_goes_on_over_the_ring_left(tmp_path):
    """D-PSGD, 4 workers; worker 3 dies after its step 7: the others form a ring of three
    and train on (each step's exchange with the neighbours left), to the consensus. Its
    exchanges recorded are those every survivor had completed when it was found gone: an
    exchange needs only the neighbours' part, so its neighbours had completed at least 6
    (for its 7th they were in theirs) and the worker opposite at least 5, whichever the
    timing (a fresh clone's make test saw 6)."""
    summary = polyrhythm.train(small_config(tmp_path, strategy="dpsgd", workers=4,
                                            dataset="digits", epochs=3,
                                            on_worker_failure="continue",
                                            dies_after_steps=[0, 0, 0, 7]))
    (lost,) = summary["lost_workers"]
    assert lost["worker"] == 3 and 5 <= lost["pushes"] <= 7
    assert [w["steps"] for w in summary["per_worker"]] == [30, 30, 30]
    assert summary["membership"][0]["workers"] == 3
    epochs = RunStore(tmp_path / "runs" / "polyrhythm.db").epochs(summary["run_id"])
    assert summary["final_val_accuracy"] > epochs[0]["val_accuracy"] + 0.05, epochs
    assert_no_rank_left()
