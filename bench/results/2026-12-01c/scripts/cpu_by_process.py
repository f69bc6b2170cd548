"""CPU use of the busiest processes over SECONDS, from /proc (user + system ticks).
Run: python cpu_by_process.py SECONDS"""

import os
import sys
import time

HZ = os.sysconf("SC_CLK_TCK")


def ticks() -> dict[str, tuple[int, str]]:
    found = {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as stat, open(f"/proc/{pid}/cmdline") as cmdline:
                    fields = stat.read().rsplit(")", 1)[1].split()
                    found[pid] = (int(fields[11]) + int(fields[12]), cmdline.read().replace("\0", " ")[:70])
            except OSError:
                pass
    return found


seconds = float(sys.argv[1])
before = ticks()
time.sleep(seconds)
after = ticks()
rows = sorted(((after[p][0] - before.get(p, (0, ""))[0], after[p][1]) for p in after), reverse=True)[:6]
for used, command in rows:
    print(f"{100 * used / HZ / seconds:6.1f}%  {command}")
