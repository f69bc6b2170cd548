"""The model thread's idle time between batches, from the shard's `read batch` debug lines (the launcher's JSON
lines, whose message carries the shard's fields as key=value):
the median and mean idle ms before a batch, and the share of the thread's time it sat idle, over the batches that
followed another within 500 ms (longer gaps are pauses between benchmark rounds). Usage: idle.py NAME FILE."""

import json
import statistics
import sys

name, path = sys.argv[1], sys.argv[2]
rows = []
for line in open(path):
    message = json.loads(line)["message"]
    if not message.startswith("read batch "):
        continue
    fields = dict(pair.split("=", 1) for pair in message[len("read batch ") :].split())
    rows.append({key: None if value == "null" else float(value) for key, value in fields.items()})
near = [r for r in rows if r.get("idle_ms") is not None and r["idle_ms"] < 500]
idle = [r["idle_ms"] for r in near]
run = [r["run_ms"] for r in near]
print(
    json.dumps(
        {
            "server": name,
            "batches": len(near),
            "idle_ms_median": round(statistics.median(idle), 3),
            "idle_ms_mean": round(statistics.mean(idle), 3),
            "run_ms_median": round(statistics.median(run), 3),
            "reads_per_batch_mean": round(statistics.mean(r["reads"] for r in near), 1),
            "idle_share": round(sum(idle) / (sum(idle) + sum(run)), 4),
        }
    )
)
