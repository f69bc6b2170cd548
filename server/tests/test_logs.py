"""The shard's log setup: `--log-level debug` (the launcher's `--shard-log-level debug`) makes the shard's own
loggers verbose and leaves every library at info or quieter."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from decision_server.logs import setup_logging


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root, ours = logging.getLogger(), logging.getLogger("decision_server")
    saved = (root.handlers[:], root.level, ours.level)
    yield
    root.handlers[:], root.level = saved[0], saved[1]
    ours.setLevel(saved[2])


def lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in capsys.readouterr().err.splitlines()]


def test_debug_is_the_shards_own_lines_only(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("debug")
    logging.getLogger("decision_server.service").debug("read batch", extra={"fields": {"packed_tokens": 860}})
    logging.getLogger("a_library").debug("a library detail")
    logging.getLogger("a_library").info("a library note")
    got = lines(capsys)
    assert [(line["level"], line["message"]) for line in got] == [("DEBUG", "read batch"), ("INFO", "a library note")]
    assert got[0]["packed_tokens"] == 860


def test_info_and_quieter_apply_to_everything(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("INFO")
    logging.getLogger("decision_server.service").debug("read batch")
    logging.getLogger("decision_server.service").info("model loaded")
    setup_logging("warning")
    logging.getLogger("decision_server.service").info("model loaded again")
    logging.getLogger("PIL").info("a library note")
    logging.getLogger("decision_server.service").warning("slow")
    assert [line["message"] for line in lines(capsys)] == ["model loaded", "slow"]


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        setup_logging("loud")
