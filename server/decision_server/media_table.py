"""The table of every served architecture and medium (text, images, videos, audio) and its status, rendered from the
shard's registry (architectures.py), the one source of what each model reads: README and docs/media.md carry it
between markers, and a test fails when they drift (`decision-server print-media-table` prints it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from decision_server.architectures import (
    ARCHITECTURES,
    AUDIO,
    IMAGE,
    JOINT_HEAD_MARKER,
    JOINT_SCHEMA_FAMILIES,
    VIDEO,
    lookup,
)

# The table's media columns, in the order requests list them.
MEDIA_COLUMNS = ((IMAGE, "images"), (VIDEO, "videos"), (AUDIO, "audio"))
READ = "yes"
REFUSED = "400"
# The marker lines a generated table sits between, in a Markdown file.
BEGIN = "<!-- media-table: decision-server print-media-table -->"
END = "<!-- /media-table -->"


@dataclass(frozen=True)
class Row:
    """One row: the architectures it stands for (equal statuses are one row) and each medium's status."""

    names: tuple[str, ...]
    statuses: tuple[str, ...]


def _rows(notes: bool) -> Iterator[tuple[str, tuple[str, ...]]]:
    def status(media: frozenset[str], given: tuple[tuple[str, str], ...], medium: str) -> str:
        plain = READ if medium in media else REFUSED
        note = dict(given).get(medium)
        return f"{plain} ({note})" if notes and note else plain

    for entry in ARCHITECTURES.values():
        yield f"`{entry.name}`", tuple(status(entry.media, entry.media_notes, m) for m, _ in MEDIA_COLUMNS)
    # Causal LMs the registry does not list load through transformers' AutoModelForCausalLM, text only.
    other = lookup("other")
    yield "other `…ForCausalLM`", tuple(status(other.media, other.media_notes, m) for m, _ in MEDIA_COLUMNS)
    for family in JOINT_SCHEMA_FAMILIES.values():
        name = f"{family.name} (`{family.architecture}` + `{JOINT_HEAD_MARKER}`)" if notes else family.name
        yield name, tuple(status(family.media, family.media_notes, m) for m, _ in MEDIA_COLUMNS)


def media_rows(notes: bool = True) -> list[Row]:
    """Every served architecture (registry order, then the joint-schema families), rows with equal statuses
    merged."""
    rows: list[Row] = []
    for name, statuses in _rows(notes):
        same = next((index for index, row in enumerate(rows) if row.statuses == statuses), None)
        if same is None:
            rows.append(Row((name,), statuses))
        else:
            rows[same] = Row((*rows[same].names, name), statuses)
    return rows


def media_table(notes: bool = True) -> str:
    """The Markdown table between its markers. Text is read by every architecture; a medium is read when the
    folder ships the model's processor (`processor_config.json`), else refused like the 400s."""
    lines = [
        BEGIN,
        "| architecture | text | " + " | ".join(column for _, column in MEDIA_COLUMNS) + " |",
        "|---|---|" + "---|" * len(MEDIA_COLUMNS),
        *(f"| {', '.join(row.names)} | {READ} | " + " | ".join(row.statuses) + " |" for row in media_rows(notes)),
        END,
    ]
    return "\n".join(lines) + "\n"


def generated_block(text: str) -> str | None:
    """The table block (markers included) a Markdown text carries, or None."""
    start = text.find(BEGIN)
    end = text.find(END, start)
    if start < 0 or end < 0:
        return None
    return text[start : end + len(END)] + "\n"
