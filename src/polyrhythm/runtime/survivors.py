"""Who is left after training, with on_worker_failure = continue.

A server sees a worker die when its connection breaks mid-run (runtime/server/server.py), but a
worker that dies after its last message is seen by nobody, until a collective waits for it.
So before the end-of-run collectives (running statistics, reports), rank 0 (server 0, or
worker 0 where there are no servers) calls the roll, the workers the members saw go
(comm/membership.py) left out: it asks each worker not known to be lost and
waits for the answer (a dead worker's broken connection fails the wait at once; a worker cut
off says nothing within the timeout), then tells every survivor which workers are gone. These
waits keep their own time (comm/waiting.py): Gloo's timeout would close every connection.
The survivors go on in groups of their own (Transport.exclude). A worker dying in the
instant between its answer and the end of the roll is not caught here: the next collective
then fails the run, naming it.
"""

from __future__ import annotations

import torch

from polyrhythm.comm.messages import LOST, ROLL_CALL
from polyrhythm.comm.transport import PeerFault, PeerLost
from polyrhythm.config.servers import CONTINUE
from polyrhythm.context import RankContext

# What a lost worker's `pushes` counts where the workers left saw it go: their rounds with it
# (a server's entry counts the gradients it pushed).
ROUNDS = "rounds"


def agree_on_lost(ctx: RankContext, seen: set[int]) -> set[int]:
    """The workers (indices) every survivor agrees were lost; `seen`: the ranks this rank
    saw die (those the workers' members went on without among them). Without
    on_worker_failure = continue, nobody is lost (a death ends the run)."""
    if ctx.config.on_worker_failure != CONTINUE:
        return set()
    if ctx.transport.membership is not None:  # its last operation done: answer any behind
        ctx.transport.membership.finish()
    seen = set(seen) | {entry["rank"] for entry in lost_by_members(ctx)}
    topology, transport = ctx.topology, ctx.transport
    flags = torch.zeros(topology.world_size)
    with transport.uncounted():
        if ctx.rank == 0:
            lost = set(seen) | {r for r in topology.worker_ranks  # rank 0: worker 0, or not
                                if r not in seen | {0} and not _answers(ctx, r)}
            if len(lost) == topology.workers:
                # Lost peers explain it (a launcher names the rank that failed first).
                raise PeerLost(None, RuntimeError("every worker was lost"))
            flags[sorted(lost)] = 1
            for r in range(1, topology.world_size):
                if r not in lost:
                    transport.isend(flags, r, tag=LOST).wait(ctx.config.timeout)
        else:
            # Rank 0 may first wait out a silent worker's timeout while serving, then one
            # for a worker it calls (cut off after its last message): each survivor waits
            # that long for it, on its own clock (Pending.wait), never Gloo's.
            within = 2 * ctx.config.timeout
            if topology.role(ctx.rank) == "worker":
                here = torch.ones(1)
                transport.irecv(here, 0, tag=ROLL_CALL).wait(within)
                transport.isend(here, 0, tag=ROLL_CALL).wait(ctx.config.timeout)
            transport.irecv(flags, 0, tag=LOST).wait(within)
    lost = {r for r in range(topology.world_size) if flags[r]}
    if lost:
        transport.exclude(lost)
    return {topology.worker_index(r) for r in lost}


def lost_by_members(ctx: RankContext) -> list[dict]:
    """The workers a collective strategy's members went on without (comm/membership.py), as
    a server reports those it lost: when they went, and the rounds (sums, averages,
    exchanges) each had taken part in: `pushes`, `counted` in ROUNDS."""
    membership = ctx.transport.membership
    if membership is None:
        return []
    return [{"worker": ctx.topology.worker_index(rank), "rank": rank,
             "at_s": at - ctx.started, "pushes": done, "counted": ROUNDS}
            for done, lost, at in membership.changes for rank in lost]


def _answers(ctx: RankContext, rank: int) -> bool:
    """Whether worker `rank` answers the roll call (False: its connection is broken, or it
    says nothing within the timeout: cut off). The waits keep their own time: Gloo's
    timeout would close every connection of this rank, the survivors' too."""
    box, within = torch.ones(1), ctx.config.timeout
    try:
        ctx.transport.isend(box, rank, tag=ROLL_CALL).wait(within)
        ctx.transport.irecv(box, rank, tag=ROLL_CALL).wait(within)
    except PeerFault:
        return False
    return True
