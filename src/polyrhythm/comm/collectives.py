"""All-reduce schedules over point-to-point messages (placeholder until written)."""

ALGORITHMS: dict = {}


def all_reduce(transport, tensor, ranks, rank, algorithm):
    raise NotImplementedError(algorithm)
