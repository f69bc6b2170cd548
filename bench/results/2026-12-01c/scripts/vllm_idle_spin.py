"""How long a process keeps a core busy after a command ends: runs COMMAND (e.g. one decision-bench request to
vLLM), then prints PID's CPU use every half second for six seconds.
Run: python vllm_idle_spin.py PID COMMAND..."""

import os
import subprocess
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")
PID = sys.argv[1]


def busy_ticks() -> int:
    with open(f"/proc/{PID}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
done = time.time()
last = busy_ticks()
for _ in range(12):
    time.sleep(0.5)
    now = busy_ticks()
    print(f"+{time.time() - done:.1f}s worker {100 * (now - last) / HZ / 0.5:.0f}% of a core")
    last = now
