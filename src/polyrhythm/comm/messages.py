"""Parameter-server message layout, shared by servers and workers (float32 tensors):

  push  = [kind, clock, pulled version, weight, gradient slice ...]   worker -> server
  reply = [version, parameter slice ...]                              server -> worker

One tensor per message keeps a push to one round trip; float32 holds the integer header
fields exactly up to 2**24 (16.7 million clocks or versions).
"""

PUSH, DONE = 0.0, 1.0
PUSH_HEADER = 4
REPLY_HEADER = 1
