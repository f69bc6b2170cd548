"""Step-by-step progress lines for the long one-off commands (export, fixtures).
Conversions take tens of seconds; a line per step tells an operator the command is alive and how far it is."""

from __future__ import annotations

import logging
import time


class StepProgress:
    """Logs `step i/N (p%): what` before each step and a final `done` line with the elapsed time."""

    def __init__(self, logger: logging.Logger, task: str, total_steps: int) -> None:
        self._logger = logger
        self._task = task
        self._total = total_steps
        self._done = 0
        self._started = time.monotonic()

    def step(self, what: str) -> None:
        percent = round(100 * self._done / self._total)
        self._done += 1
        self._logger.info(
            f"{self._task}: step {self._done}/{self._total} ({percent}%): {what}",
            extra={"fields": {"step": self._done, "steps": self._total, "percent": percent}},
        )

    def finish(self, what: str) -> None:
        elapsed = time.monotonic() - self._started
        self._logger.info(
            f"{self._task}: done (100%) in {elapsed:.1f}s: {what}",
            extra={"fields": {"steps": self._total, "percent": 100, "elapsed_s": round(elapsed, 3)}},
        )
