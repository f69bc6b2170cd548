"""Collector settings tried on bench/host_batch.py's batch (64 x 8 x 512, tree engine, one thread): MODE is `plain`
(Python's defaults), `freeze` (gc.collect + gc.freeze after the warm-up run), `t=N` (young threshold N), or a comma
list of them. Prints mean / median / max batch ms (thread CPU time of engine.run) and the collector's ms per batch.
Run: .venv/bin/python bench/results/2026-12-07-gc/thresholds.py MODE   (host_batch.py --no-settle is used)"""

import gc
import runpy
import statistics
import sys
import time

import decision_server.engines.tree as tree

mode = sys.argv.pop(1)
state = {"collected": 0.0, "started": 0.0, "runs": [], "collections": [], "first": True}


def on_collection(phase: str, info: dict) -> None:
    if phase == "start":
        state["started"] = time.perf_counter()
    else:
        state["collected"] += time.perf_counter() - state["started"]


gc.callbacks.append(on_collection)
original = tree.TreeEngine.run


def run(self, reads):
    if state["first"]:
        state["first"] = False
        for part in mode.split(","):
            if part == "freeze":
                gc.collect()
                gc.freeze()
            elif part.startswith("t="):
                gc.set_threshold(int(part[2:]), 10, 10)
    state["collected"] = 0.0
    started = time.thread_time()
    try:
        return original(self, reads)
    finally:
        state["runs"].append((time.thread_time() - started) * 1e3)
        state["collections"].append(state["collected"] * 1e3)


tree.TreeEngine.run = run
sys.argv = ["host_batch.py", "--runs", "12", "--no-settle"]
runpy.run_path("bench/host_batch.py", run_name="__main__")
runs, collections = state["runs"][1:], state["collections"][1:]
print(
    f"{mode}: batch ms mean {statistics.mean(runs):.1f} median {statistics.median(runs):.1f} max {max(runs):.1f}"
    f" | collector ms per batch mean {statistics.mean(collections):.1f} max {max(collections):.1f}"
)
