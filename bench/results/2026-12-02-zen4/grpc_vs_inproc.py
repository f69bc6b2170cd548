# ruff: noqa
# Same reads (30-token head + 510-token state + 8 x 40-token questions, single-token labels) sent to a served shard
# over gRPC (forward_micros) and run in-process (TreeEngine with a prefix cache), alternating; bfloat16 or float32.
import os, statistics, subprocess, sys, time
from pathlib import Path
import grpc, torch
sys.path.insert(0, "server/bench"); sys.path.insert(0, "server/tests")
from reads_bench import make_reads
from decision_server.pb import decision_pb2, decision_pb2_grpc
model_dir, dtype, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
head = list(range(100, 130))
uds = f"/tmp/gvi-{os.getpid()}.sock"
env = {**os.environ, "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"}
shard = subprocess.Popen([".venv/bin/decision-server", "serve", model_dir, "--uds-path", uds, "--dtype", dtype,
                          "--threads", "2", "--prefix-cache-mb", "2048", "--matmul", "fast"], env=env,
                         stderr=open("/tmp/gvi-shard.log", "w"))
def reads(seed):
    return make_reads(32000, 510, 8, 40, seed=seed)
def request(seed):
    return decision_pb2.ReadRequest(reads=[decision_pb2.Read(id=r.id, next_token=decision_pb2.NextTokenRead(
        token_ids=head + list(r.prompt), labels=[decision_pb2.LabelGroup(variants=[decision_pb2.LabelSequence(token_ids=list(l))]) for l in r.labels]))
        for r in reads(seed)])
try:
    for _ in range(300):
        if os.path.exists(uds): break
        time.sleep(1)
    time.sleep(3)
    channel = grpc.insecure_channel(f"unix://{uds}")
    stub = decision_pb2_grpc.DecisionShardStub(channel)
    stub.Read(request(1), timeout=600)
    served = []
    for i in range(rounds):
        t = time.perf_counter(); resp = stub.Read(request(100 + i), timeout=600)
        served.append((resp.forward_micros / 1e6, time.perf_counter() - t))
    print("served (forward s, call s):", [(round(a, 3), round(b, 3)) for a, b in served])
    print("served forward median", statistics.median(a for a, _ in served))
finally:
    shard.terminate(); shard.wait()
