"""Does decoding an image hold up other requests' reads? An in-process shard (the real gRPC service) on tiny-lfm2-vl
answers a stream of text reads, alone and while another client keeps sending reads with a 12 MP JPEG (about a second
of decoding and processing each). Reports text-read latency medians and p90 for both runs and how many image reads
completed. Run: .venv/bin/python bench/results/2026-12-01e/media_blocking.py"""

from __future__ import annotations

import hashlib
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[3] / "server" / "tests"))

from conftest import running_shard
from decision_server.model import LoadOptions, load_model
from decision_server.paths import models_dir
from decision_server.pb import decision_pb2
from media_processing import jpeg

TEXT_READS = 40


def read(ids: list[int], media: list[decision_pb2.MediaItem]) -> decision_pb2.ReadRequest:
    labels = [decision_pb2.LabelGroup(variants=[decision_pb2.LabelSequence(token_ids=[t])]) for t in (565, 566)]
    return decision_pb2.ReadRequest(
        reads=[
            decision_pb2.Read(id=0, media=media, next_token=decision_pb2.NextTokenRead(token_ids=ids, labels=labels))
        ]
    )


def main() -> None:
    model = load_model(models_dir() / "tiny-lfm2-vl", LoadOptions(dtype="float32"))
    tokenizer = model.media.tokenizer

    def prompt(images: int) -> list[int]:
        content = [*({"type": "image"} for _ in range(images)), {"type": "text", "text": "Refund not received. " * 20}]
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
        )
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    data = jpeg(4032, 3024)
    image = decision_pb2.MediaItem(
        modality=decision_pb2.IMAGE, data=data, sha256=hashlib.sha256(data).hexdigest(), name="images.0"
    )
    with running_shard(model, "auto") as stub:
        text = read(prompt(0), [])
        for _ in range(3):
            stub.Read(text)

        def text_latencies() -> list[float]:
            out = []
            for _ in range(TEXT_READS):
                started = time.perf_counter()
                stub.Read(text)
                out.append(time.perf_counter() - started)
            return out

        alone = text_latencies()
        stop = threading.Event()
        image_reads = [0]

        def images() -> None:
            with_image = read(prompt(1), [image])
            while not stop.is_set():
                model.media._decoded.clear()
                stub.Read(with_image)
                image_reads[0] += 1

        worker = threading.Thread(target=images)
        worker.start()
        time.sleep(0.5)
        beside = text_latencies()
        stop.set()
        worker.join()
    for name, values in [("text reads alone", alone), ("beside 12 MP image reads", beside)]:
        values = sorted(values)
        print(
            f"{name:26s} median {statistics.median(values) * 1e3:6.1f} ms  "
            f"p90 {values[int(0.9 * len(values))] * 1e3:6.1f} ms"
        )
    print(f"image reads completed meanwhile: {image_reads[0]}")


if __name__ == "__main__":
    main()
