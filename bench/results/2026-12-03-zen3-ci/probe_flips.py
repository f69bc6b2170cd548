# How often `--matmul auto` picks each mode across fresh probes.
# Run from the repo: .venv/bin/python probe_flips.py ROUNDS
import collections
import sys
import time

import torch
from decision_server import layers

torch.set_num_threads(2)

rounds = int(sys.argv[1])
c = collections.Counter()
ratios = []
t = time.perf_counter()
for _i in range(15):
    p = layers.probe_matmul(1024, 6144, rounds=rounds, bfloat16_weights=True)
    c[p.choice] += 1
    ratios.append(p.seconds["exact"] / p.seconds["fast"])
ratios.sort()
print(
    rounds,
    c,
    f"ratios min {ratios[0]:.3f} median {ratios[7]:.3f} max {ratios[-1]:.3f}",
    "s/probe %.2f" % ((time.perf_counter() - t) / 15),
)
