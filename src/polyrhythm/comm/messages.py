"""Parameter-server message layout, shared by servers and workers (float32 tensors):

  push  = [kind, clock, pulled version, weight, bucket, gradient slice ..., padding]
          worker -> server, tag 0; padded to the server's largest bucket, so one receive
          buffer per worker fits every push of that worker
  reply = [version, parameter slice ...]
          server -> worker, tag = bucket id, so replies may arrive in any order

One tensor per message keeps a push to one round trip; float32 holds the integer header
fields exactly up to 2**24 (16.7 million clocks, versions or buckets).
"""

PUSH, DONE = 0.0, 1.0
PUSH_HEADER = 5
REPLY_HEADER = 1
