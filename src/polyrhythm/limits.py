"""The largest (and, where it matters, the smallest) values of a run's settings that the run
can honour, each with why. The declarations' ranges read them (config/declared.py,
config/emulation.py, config/spark.py, data/, strategies/, compression/), so a value beyond
one is a one-line error before anything is recorded; tests/test_limits.py drives each bound
through what consumes it. Torch-free, and importing nothing of the stack.

A bound is where a consumer breaks (measured with torch 2.13 on Linux, as said), or, where
nothing breaks before memory or time runs out, a value far beyond any study and far below
where that happens.
"""

from __future__ import annotations

DAY_S = 86400.0

# Workers and servers: a process each, and a server's policy keeps state per worker, built
# as the config is checked (fuzzing found 10^8 workers taking 24 GB there).
MAX_WORKERS = 65536

# The seconds a process waits for a peer. Gloo keeps time in int64 nanoseconds, overflowing
# near 9.2e9 s: a timeout of 9e9 s left both ranks of a job spinning in the rendezvous, 1e10
# failed it at once ("timed out after 10000000000000ms"). The waits that keep their own time
# hand Gloo a 365-day timeout (comm/waiting.py NEVER), which the run's must stay under. And
# Gloo counts whole milliseconds: below one, its timeout is 0 ms and every connect fails.
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.001, 30 * DAY_S

# An emulated delay (a step's compute time, a worker's extra delay, a message's latency,
# their jitter): time.sleep overflows past 9.2e9 s ("timestamp out of range for platform
# time_t"), and a day a step or a message is beyond any cluster emulated.
MAX_DELAY_S = DAY_S
# A slower worker sleeps (slowdown - 1) x its step's compute time after it; the
# Strategy-Switch thesis's stragglers are 2 to 4 times slower.
MAX_SLOWDOWN = 1000.0

# torch threads per worker: torch 2.13 crashed (SIGSEGV) at 100,000, as OpenMP starts each;
# 1024, more cores than a machine has, ran on 2 cores.
MAX_THREADS = 1024
# An emulated host's CPU share in cores, a cgroup quota per 100 ms period: the kernel takes
# no quota under 1 ms a period (0.01 cores); no more cores than threads.
MIN_CPU, MAX_CPU = 0.01, float(MAX_THREADS)

# Link rates that tc's tbf keeps (measured with tc here): it keeps its bucket as a u32 of
# clock ticks, so below 1 kbit the 32 KiB bucket shrinks and the rate is rounded (500 bit:
# 496 bit and 15,725 bytes; 1 bit is refused), and at 1 tbit the bucket shows 0 bytes.
MIN_RATE_BITS, MAX_RATE_BITS = 8e3, 100e9

# A factor on float32 weights (lr, weight decay, eps): torch refuses one beyond float32's
# 3.4e38 ("value cannot be converted to type float without overflow"), and Adam's first
# step is lr / (1 - beta1), 1 - beta1 as small as 1.1e-16: from 1e6 no step reaches 1e23.
MAX_FACTOR = 1e6

# Classes of a classifier, a logit each: the last layer is features x classes weights in
# every process (2**20 classes on 512 features: 2 GiB a copy). ImageNet-21k has 21,841.
MAX_CLASSES = 2**20

# A generated data set (synthetic, table): its values, samples x features, are made in
# float64 and kept in float32 by every process that reads it (2**30: 8 GiB while made).
MAX_GENERATED_VALUES = 2**30

# QSGD's levels: a value's code, its sign above its level's bits, is an int32; from 2**30
# levels the sign lands on int32's own bit and values decode wrong (measured: errors of 14
# on unit values, 2e-7 at 2**29).
MAX_QSGD_LEVELS = 2**30 - 1

# Downpour's push and fetch periods: the simulator replays lcm(push_every, fetch_every)
# steps, a list that two periods of 10^4 would make 10^8 long.
MAX_PERIOD = 1000

# Spark reads an executor's memory as an int of MB (Utils.memoryStringToMb).
MAX_SPARK_MB = 2**31 - 1
# mapreduce's partitions: a Spark task each for every mini-batch; no more than the workers a
# run may have.
MAX_PARTITIONS = MAX_WORKERS
