"""The media table (every served architecture and text, images, videos, audio) in README.md and docs/media.md is the
one `decision-server print-media-table` renders from the shard's registry, and each "yes" is what the shard reports
for a fixture of that architecture whose folder ships its processor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from decision_server.architectures import ARCHITECTURES, lookup
from decision_server.cli import main
from decision_server.fixtures import make_fixture
from decision_server.media_table import BEGIN, END, generated_block, media_rows, media_table
from decision_server.multimodal import MediaProcessor
from decision_server.paths import models_dir

ROOT = Path(__file__).resolve().parents[2]
# A fixture per architecture that reads media, each shipping its processor.
PROCESSOR_FIXTURES = ("tiny-qwen3.5", "tiny-qwen3.5-moe", "tiny-lfm2-vl", "tiny-gemma4-mm", "tiny-diffusiongemma")


@pytest.mark.parametrize(("document", "notes"), [("README.md", False), ("docs/media.md", True)])
def test_the_documents_carry_the_generated_table(document: str, notes: bool) -> None:
    text = (ROOT / document).read_text(encoding="utf-8")
    assert text.count(BEGIN) == 1 and text.count(END) == 1, document
    assert generated_block(text) == media_table(notes), (
        f"{document}'s media table drifted from server/decision_server/architectures.py: "
        f"paste `decision-server print-media-table{'' if notes else ' --compact'}` between its markers"
    )


def test_every_served_architecture_has_a_row_with_its_declared_media(capsys: pytest.CaptureFixture[str]) -> None:
    rows = media_rows(notes=False)
    named = {name.strip("`"): row.statuses for row in rows for name in row.names}
    for entry in ARCHITECTURES.values():
        statuses = named[entry.name]
        assert statuses == tuple("yes" if m in entry.media else "400" for m in ("image", "video", "audio")), entry
    assert named["Clef-Omni"] == ("yes", "yes", "yes") and named["Clef-Flash"] == ("yes", "yes", "400")
    assert main(["print-media-table", "--compact"]) == 0
    assert capsys.readouterr().out == media_table(False)


def test_the_makefile_rebuilds_every_processor_fixture_from_an_older_cache() -> None:
    makefile = (ROOT / "Makefile").read_text()
    line = next(line for line in makefile.splitlines() if line.startswith("PROCESSOR_FIXTURES :="))
    assert sorted(line.split(":=")[1].split()) == sorted(PROCESSOR_FIXTURES)
    architectures = set()
    for name in PROCESSOR_FIXTURES:
        make_fixture(name, models_dir() / name, seed=0)
        architectures.add(json.loads((models_dir() / name / "config.json").read_text())["architectures"][0])
    # Every architecture that reads media has a fixture whose processor the tests read it with.
    assert architectures == {entry.name for entry in ARCHITECTURES.values() if entry.media}


@pytest.mark.parametrize("name", PROCESSOR_FIXTURES)
def test_each_yes_is_what_the_fixtures_processor_reads(name: str) -> None:
    folder = models_dir() / name
    make_fixture(name, folder, seed=0)
    architecture = lookup(json.loads((folder / "config.json").read_text())["architectures"][0])
    processor = MediaProcessor.for_folder(folder, architecture)
    assert processor is not None
    assert processor.modalities == tuple(sorted(architecture.media))
