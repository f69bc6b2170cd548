"""The reference engine: one plain causal prefill per read and per multi-token label.
It shares nothing between reads, so it is slow but obviously right; the tree and fork engines are tested against it."""

from __future__ import annotations

import time
from collections.abc import Sequence

from decision_server.engines.base import NextTokenEngine
from decision_server.engines.types import BatchOutcome, ReadOutcome, ReadSpec
from decision_server.model_base import ScoredPass, ScoreRequest


class NaiveEngine(NextTokenEngine):
    name = "naive"

    def _run_valid(self, reads: Sequence[ReadSpec]) -> BatchOutcome:
        outcome = BatchOutcome(outcomes=[])
        for read in reads:
            outcome.outcomes.append(self._read(read, outcome))
        return outcome

    def _read(self, read: ReadSpec, batch: BatchOutcome) -> ReadOutcome:
        prompt = list(read.prompt)
        single = [index for index, label in enumerate(read.labels) if len(label) == 1]
        # One row (the answer position): every single-token label is read there, and the greedy token.
        answer = self._prefill(prompt, [len(prompt) - 1], [0] * len(single), [read.labels[i][0] for i in single], batch)
        greedy = answer.greedy_tokens[0]
        computed = len(prompt)
        values = dict(zip(single, answer.label_logprobs, strict=True))
        for index, label in enumerate(read.labels):
            if len(label) == 1:
                continue
            # The label's own prefill: the prompt again, then every label token but the last, scoring each next token.
            sequence = prompt + list(label[:-1])
            keep = list(range(len(prompt) - 1, len(sequence)))
            rows = self._prefill(sequence, keep, list(range(len(label))), list(label), batch)
            values[index] = sum(rows.label_logprobs)
            computed += len(prompt)
        return ReadOutcome(
            id=read.id,
            label_logprobs=[values[index] for index in range(len(read.labels))],
            greedy_token_id=greedy,
            tokens_computed=computed,
        )

    def _prefill(
        self, tokens: list[int], keep: list[int], label_rows: list[int], label_tokens: list[int], batch: BatchOutcome
    ) -> ScoredPass:
        started = time.perf_counter()
        scored = self.model.score(
            ScoreRequest(token_ids=tokens, keep=keep, label_rows=label_rows, label_tokens=label_tokens, greedy_rows=[0])
        )
        self.model.synchronize()
        batch.forward_seconds += time.perf_counter() - started
        batch.forward_passes += 1
        batch.packed_tokens += len(tokens)
        return scored
