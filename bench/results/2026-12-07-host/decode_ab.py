"""The shard's decode of a 64 x 8 x 512 ReadRequest (parse + `read_specs`), prompts whole against prompts sent with
`shared_prefix` (as the router now sends them). Run: .venv/bin/python bench/results/2026-12-07-host/decode_ab.py"""

import statistics
import time

import torch
from decision_server.pb import decision_pb2 as pb
from decision_server.read_kinds.next_token import read_specs


def request(share: bool) -> bytes:
    generator = torch.Generator().manual_seed(0)
    message = pb.ReadRequest()
    for r in range(64):
        state = torch.randint(20, 1000, (522,), generator=generator).tolist()
        for q in range(8):
            read = message.reads.add()
            read.id = r * 8 + q
            question = torch.randint(20, 1000, (18,), generator=generator).tolist()
            if share and q:
                read.next_token.shared_prefix = 522
                read.next_token.token_ids.extend(question)
            else:
                read.next_token.token_ids.extend(state + question)
            for label in ((3,), (4,), (7, 8)):
                read.next_token.labels.add().variants.add().token_ids.extend(label)
    return message.SerializeToString()


for share in (False, True):
    data = request(share)
    times = []
    for _ in range(15):
        started = time.thread_time()
        specs = read_specs(pb.ReadRequest.FromString(data))
        times.append((time.thread_time() - started) * 1000)
    print(f"shared_prefix {share}: {len(data)} bytes, decode {statistics.median(times):.1f} ms (median of 15)")
