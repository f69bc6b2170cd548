"""The reference read strategy: one plain causal prefill per read and per multi-token label.
It shares nothing between reads, so it is slow but obviously right; tree reads are tested against it."""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from decision_server.reads.base import ReadStrategy
from decision_server.reads.scoring import argmax_rows, gather, log_probs
from decision_server.reads.types import BatchOutcome, ReadOutcome, ReadSpec


class NaiveReads(ReadStrategy):
    name = "naive"

    def _run_valid(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        outcome = BatchOutcome(outcomes=[])
        for read in reads:
            outcome.outcomes.append(self._read(read, outcome))
        return outcome

    def _read(self, read: ReadSpec, batch: BatchOutcome) -> ReadOutcome:
        prompt = list(read.prompt)
        answer = log_probs(self._prefill(prompt, [len(prompt) - 1], batch))
        greedy = argmax_rows(answer, [0])[0]
        computed = len(prompt)
        single = [index for index, label in enumerate(read.labels) if len(label) == 1]
        values = dict(zip(single, gather(answer, [0] * len(single), [read.labels[i][0] for i in single]), strict=True))
        for index, label in enumerate(read.labels):
            if len(label) == 1:
                continue
            # The label's own prefill: the prompt again, then every label token but the last, scoring each next token.
            sequence = prompt + list(label[:-1])
            rows = log_probs(self._prefill(sequence, list(range(len(prompt) - 1, len(sequence))), batch))
            values[index] = sum(gather(rows, range(len(label)), label))
            computed += len(prompt)
        return ReadOutcome(
            id=read.id,
            label_logprobs=[values[index] for index in range(len(read.labels))],
            greedy_token_id=greedy,
            tokens_computed=computed,
        )

    def _prefill(self, tokens: list[int], keep: list[int], batch: BatchOutcome) -> torch.Tensor:
        started = time.perf_counter()
        logits = self.model.next_token_logits(tokens, keep)
        self.model.synchronize()
        batch.forward_seconds += time.perf_counter() - started
        batch.forward_passes += 1
        batch.packed_tokens += len(tokens)
        return logits
