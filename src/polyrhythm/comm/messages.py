"""Parameter-server message layout, shared by servers and workers (float32 tensors):

  push  = [kind, clock, pulled version, weight, bucket, settings ..., values ..., padding]
          worker -> server, tag 0; padded to the server's largest bucket, so one receive
          buffer per worker fits every push of that worker; `settings`, only in a script
          that wraps its optimizer, are every number of every param group of it now (its
          scheduler's rates among them, each a float64 in two words:
          runtime/worker/user_optimizer.py Hyperparameters), which the servers step at;
          without them the servers follow the run's own [optimizer] schedule
  reply = [version, over, progress, parameter slice ...]
          server -> worker, tag = bucket id, so replies may arrive in any order; `over` is
          1 once the server has ended training (k-BSP and backup workers: the run's rounds
          are done; with shared epochs: the run's global batches are applied), and the
          worker stops at once; `progress` is the global batches' worth of gradient the
          bucket has applied (shared epochs end on it)

  handover = [switched, steps, weights of each bucket ..., then for each per-element
              optimizer state (SGD's momentum; Adam's two moments) that state of each
              bucket ..., then the optimizer's scalars (Adam's step count)]
          worker 0 -> server, tag HANDOVER, once, in a Strategy-Switch run
          (strategies/switch_worker.py): the state the server starts from, its buckets in order;
          `switched` is 0 when the run ended before its switch (the server then only holds
          the final model), `steps` the global steps taken so far

`kind` is a sum of flags: GRADIENT, REPLY, DONE (strategies/serving.py, where what a server
does with each kind is decided, for the real server and the simulator alike; the simulator
imports nothing of comm).

One tensor per message keeps a push to one round trip; float32 holds the integer header
fields exactly up to 2**24 (16.7 million clocks, versions or buckets).
"""

PUSH_HEADER = 5
REPLY_HEADER = 3
HANDOVER = 1 << 20  # a tag no bucket id reaches
HANDOVER_HEADER = 2
# After training, with on_worker_failure = continue (runtime/survivors.py): rank 0 asks each
# worker and it answers (one value each way), then rank 0 tells every survivor who was lost
# (one value per rank, 1 for lost).
ROLL_CALL, LOST = HANDOVER + 1, HANDOVER + 2
# A receive from a peer on a tag nothing is ever sent on: Gloo fails it when the peer's
# connection breaks, which is how a rank that may go on without the peer learns it is gone
# (comm/waiting.py).
WATCH = HANDOVER + 3
# The workers' greetings when their members change, generation by generation from here
# (comm/membership.py): each member's count of completed all-reduces, and the result of one
# interrupted, handed to the members that did not complete it.
MEMBERS = HANDOVER + 16
