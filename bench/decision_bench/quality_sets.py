"""The labelled sets behind `decision-quality` (docs/quality.md): short texts whose answer is certain, written for this
project (Apache-2.0, like the repository) or generated here from a fixed seed, and written out as JSONL under
bench/data/quality/ (`python -m decision_bench.quality_sets --write`). The files are what the benchmark reads; this
module is their one source, and a test holds the files to it.

Each set asks one question with one set of labels over many texts, as a classification task does, so that a label
prior (`x_debias: prior`) and a calibration fit (`/v1/calibrations`) have one signature per set to learn from."""

from __future__ import annotations

import argparse
import json
import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "quality"
INSTRUCTIONS = "Read the text and answer the question about it."
KINDS = ("choice", "noul", "score")
# A choice's options (name, description) or a score's levels (name, None), in their canonical order.
Options = tuple[tuple[str, str | None], ...]
# What one item is made of: its state, question, options and answer.
Row = tuple[str, str, Options, Any]


@dataclass(frozen=True)
class Item:
    set: str
    id: str
    kind: str
    state: str
    question: str
    # choice: option name -> description (None for none), in the canonical order; score: the levels, lowest first.
    options: Options
    # choice: the option's name; noul: true/false; score: the level's index.
    answer: str | bool | int

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.options)

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"set": self.set, "id": self.id, "type": self.kind, "state": self.state}
        row["question"] = self.question
        if self.kind == "choice":
            row["options"] = dict(self.options)
        elif self.kind == "score":
            row["levels"] = list(self.names)
        row["answer"] = self.answer
        return row

    @staticmethod
    def from_json(row: dict[str, Any]) -> Item:
        kind = row["type"]
        if kind == "choice":
            options: tuple[tuple[str, str | None], ...] = tuple(row["options"].items())
        elif kind == "score":
            options = tuple((level, None) for level in row["levels"])
        else:
            options = ()
        return Item(row["set"], row["id"], kind, row["state"], row["question"], options, row["answer"])


@dataclass(frozen=True)
class LabelledSet:
    name: str
    kind: str
    measures: str
    provenance: str
    items: tuple[Item, ...]


HANDWRITTEN = "written for this project (Apache-2.0)"

# --- tickets: support-ticket routing, 4 options ----------------------------------------------------------------------
TICKET_TEAMS: Options = (
    ("billing", "charges, invoices, refunds, payments"),
    ("technical", "bugs, errors, apps or devices that do not work"),
    ("shipping", "deliveries, parcels, tracking, couriers"),
    ("account", "logins, passwords, profile and account settings"),
)
TICKETS: dict[str, tuple[str, ...]] = {
    "billing": (
        "I was charged twice for my March subscription. Please refund one of the payments.",
        "Your invoice shows 49 euros but my plan costs 29. Why the difference?",
        "I cancelled last month and you still took money from my card.",
        "Can I get a copy of the invoice for order 5521 with my company's VAT number on it?",
        "The refund you promised two weeks ago has not reached my bank account yet.",
        "My credit card expired; how do I change the card you charge each month?",
        "I was billed for the premium plan although I chose the basic one.",
        "There is a charge of 12.99 on my statement that I do not recognise.",
        "Do you offer a discount if I pay for the whole year at once?",
        "The payment page keeps declining my card but my bank says the card is fine and there is money on it.",
        "Please stop charging me the late fee; I paid the bill on time.",
        "I need a receipt for the 80 dollars I paid last Friday.",
        "Why did the price of my monthly plan go up without any notice?",
        "I paid by bank transfer on Monday, but the order still says payment pending.",
        "You charged me in dollars instead of euros and my bank added a fee.",
    ),
    "technical": (
        "The app crashes every time I open the camera screen.",
        "Since the last update the website shows error 500 when I press save.",
        "My smart thermostat lost its Wi-Fi connection and will not reconnect.",
        "The export to PDF produces an empty file.",
        "Notifications stopped working on my Android phone after the update.",
        "The printer driver you provide does not install on Windows 11.",
        "Videos in the course freeze after about ten seconds of playing.",
        "The search box returns no results, even for words that are definitely there.",
        "My headphones pair with the phone but no sound comes out.",
        "The sync between the desktop and mobile app duplicates every note.",
        "The dashboard takes more than a minute to load and then times out.",
        "When I upload a photo the progress bar stops at 99 percent.",
        "The robot vacuum keeps showing error E4 and will not start.",
        "Dark mode makes the text in the settings page invisible.",
        "The API returns a 401 error even though my key is valid.",
    ),
    "shipping": (
        "My parcel was supposed to arrive on Tuesday and it is still not here.",
        "The tracking number you sent me does not work on the courier's website.",
        "The box arrived crushed and the vase inside was broken.",
        "Can you deliver to a pick-up point instead of my home address?",
        "The courier left my package with a neighbour I do not know.",
        "I received someone else's order instead of mine.",
        "How long does delivery to Norway usually take?",
        "The tracking page has said 'in transit' for nine days.",
        "Only two of the three items I ordered were in the parcel.",
        "Please change the delivery address for order 7730 before it ships.",
        "The delivery driver never rang the bell and left a note saying nobody was home.",
        "Do you ship to Canada, and how much does express delivery cost?",
        "My order shows as delivered but there is nothing at my door.",
        "The package is stuck at customs; what papers do you need from me?",
        "Can the parcel be sent by overnight courier? I need it by Friday.",
    ),
    "account": (
        "I forgot my password and the reset email never arrives.",
        "How do I change the email address on my profile?",
        "My account is locked after too many login attempts.",
        "Please delete my account and all the data you hold about me.",
        "I cannot turn on two-factor authentication; the code is always rejected.",
        "Someone logged into my account from another country. Please secure it.",
        "How can I change the username that other people see?",
        "I have two accounts by mistake; can you merge them into one?",
        "The login page says my email is not registered, but I have used it for years.",
        "I want to add my colleague as a second user on our team account.",
        "How do I stop the weekly newsletter? I cannot find the setting in my profile.",
        "My phone number changed and now I cannot receive the login code.",
        "Please transfer ownership of the team account to my manager.",
        "I signed up with Google and now want to log in with a normal password.",
        "The profile picture I upload is never saved.",
    ),
}

# --- sentiment: written reviews, 3 options ---------------------------------------------------------------------------
SENTIMENT_LABELS: Options = (("positive", None), ("negative", None), ("neutral", None))
SENTIMENT: dict[str, tuple[str, ...]] = {
    "positive": (
        "Absolutely love this kettle. It boils fast and looks great in the kitchen.",
        "The staff were friendly and the food was delicious. We will come back.",
        "Best purchase I have made this year; the battery lasts for days.",
        "The hotel room was spotless and the view from the balcony was wonderful.",
        "Fast delivery, perfect fit, and the fabric feels lovely.",
        "This book kept me up all night. A brilliant story.",
        "The plumber arrived on time, fixed the leak in ten minutes and was very polite.",
        "Great value for money. My kids play with it every day.",
        "The new update made the app so much faster. Thank you!",
        "Comfortable shoes; I walked all day without any pain.",
        "A beautiful film with a moving ending. Highly recommended.",
        "The teacher explains everything clearly and the course is a joy.",
        "I am delighted with the garden chairs: sturdy, light and pretty.",
        "Excellent coffee and a cosy place to read.",
        "The support team solved my problem in one call. Impressive service.",
        "The headphones sound amazing and the noise cancelling is superb.",
        "Our tour guide was funny and knew everything about the old town.",
        "Perfect gift, my mother loved it.",
        "The soup was rich and tasty, and the bread was fresh from the oven.",
        "Setup took two minutes and it has worked flawlessly since.",
    ),
    "negative": (
        "The kettle started leaking after a week. Total waste of money.",
        "Rude staff and cold food. Never again.",
        "The battery dies after two hours. Very disappointed.",
        "The hotel room smelled of smoke and the shower was broken.",
        "The shirt shrank after one wash and the colour faded.",
        "Boring book; I gave up after fifty pages.",
        "The plumber was three hours late and the leak is still there.",
        "Cheap plastic that broke on the first day.",
        "Since the update the app is slow and crashes all the time.",
        "These shoes gave me blisters within an hour.",
        "A dull film with a ridiculous ending. Avoid it.",
        "The course is confusing and the teacher never answers questions.",
        "The garden chairs wobble and one leg bent in the first week.",
        "Terrible coffee, and we waited forty minutes for it.",
        "Support kept me on hold for an hour and then hung up.",
        "The headphones crackle and hurt my ears. I returned them.",
        "The tour was rushed and the guide was impossible to understand.",
        "The gift arrived broken and the seller ignored my messages.",
        "The soup was salty and the bread was stale.",
        "It stopped working after three days and the refund process is a nightmare.",
    ),
    "neutral": (
        "The kettle holds 1.7 litres and comes in white or black.",
        "The restaurant is on the corner of Main Street and opens at noon.",
        "The battery is 4000 mAh and charges with a USB-C cable.",
        "The hotel has 120 rooms and a car park behind the building.",
        "The shirt is made of cotton and is available in sizes S to XL.",
        "The book has 320 pages and was published in 2019.",
        "The plumber came on Tuesday to look at the kitchen sink.",
        "The toy is recommended for children aged four and up.",
        "The update changed the position of the menu button.",
        "I ordered the shoes in size 42.",
        "The film is two hours long and is in English with subtitles.",
        "The course has eight lessons, one per week.",
        "The chairs come in a flat box and need to be assembled.",
        "The cafe serves coffee, tea and sandwiches.",
        "I called support on Monday about my order.",
        "The headphones weigh 250 grams and fold flat.",
        "The tour starts at the main square at ten o'clock.",
        "I bought this as a gift for my mother.",
        "The menu lists three soups and two kinds of bread.",
        "The device has two buttons and a small screen.",
    ),
}

# --- categories: the category of a named thing, 4 options ------------------------------------------------------------
CATEGORY_LABELS: Options = (("animal", None), ("fruit", None), ("vehicle", None), ("tool", None))
CATEGORY_WORDS: dict[str, tuple[str, ...]] = {
    "animal": (
        "dog",
        "horse",
        "elephant",
        "rabbit",
        "tiger",
        "sheep",
        "giraffe",
        "wolf",
        "camel",
        "donkey",
        "lion",
        "zebra",
        "goat",
        "bear",
        "monkey",
        "fox",
        "deer",
        "cow",
        "kangaroo",
        "squirrel",
    ),
    "fruit": (
        "apple",
        "banana",
        "cherry",
        "pear",
        "mango",
        "grape",
        "peach",
        "plum",
        "lemon",
        "orange",
        "pineapple",
        "strawberry",
        "apricot",
        "kiwi",
        "melon",
        "raspberry",
        "fig",
        "papaya",
        "lime",
        "watermelon",
    ),
    "vehicle": (
        "car",
        "bus",
        "bicycle",
        "truck",
        "motorcycle",
        "train",
        "tractor",
        "van",
        "tram",
        "scooter",
        "taxi",
        "ambulance",
        "helicopter",
        "airplane",
        "ship",
        "submarine",
        "canoe",
        "lorry",
        "minibus",
        "jeep",
    ),
    "tool": (
        "hammer",
        "screwdriver",
        "saw",
        "wrench",
        "drill",
        "chisel",
        "pliers",
        "shovel",
        "rake",
        "axe",
        "spanner",
        "file",
        "crowbar",
        "trowel",
        "level",
        "sander",
        "clamp",
        "mallet",
        "hoe",
        "wheelbarrow",
    ),
}

# --- continents: the continent of a country, 4 options ---------------------------------------------------------------
CONTINENT_LABELS: Options = (("Africa", None), ("Asia", None), ("Europe", None), ("South America", None))
COUNTRIES: dict[str, tuple[str, ...]] = {
    "Africa": (
        "Kenya",
        "Nigeria",
        "Egypt",
        "Ghana",
        "Morocco",
        "Ethiopia",
        "Senegal",
        "Tanzania",
        "Angola",
        "Uganda",
        "Mali",
        "Zambia",
    ),
    "Asia": (
        "Japan",
        "India",
        "Thailand",
        "Vietnam",
        "Indonesia",
        "Nepal",
        "Mongolia",
        "Pakistan",
        "Malaysia",
        "Cambodia",
        "Bangladesh",
        "Laos",
    ),
    "Europe": (
        "France",
        "Germany",
        "Italy",
        "Spain",
        "Poland",
        "Sweden",
        "Norway",
        "Portugal",
        "Austria",
        "Hungary",
        "Ireland",
        "Denmark",
    ),
    "South America": (
        "Brazil",
        "Argentina",
        "Chile",
        "Peru",
        "Colombia",
        "Venezuela",
        "Ecuador",
        "Bolivia",
        "Uruguay",
        "Paraguay",
        "Guyana",
        "Suriname",
    ),
}

# --- capitals (yes/no): statements about capitals, true or with another country's capital ----------------------------
CAPITALS = (
    ("France", "Paris"),
    ("Germany", "Berlin"),
    ("Italy", "Rome"),
    ("Spain", "Madrid"),
    ("Japan", "Tokyo"),
    ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Norway", "Oslo"),
    ("Greece", "Athens"),
    ("Russia", "Moscow"),
    ("Poland", "Warsaw"),
    ("Austria", "Vienna"),
    ("Portugal", "Lisbon"),
    ("Sweden", "Stockholm"),
    ("Ireland", "Dublin"),
    ("Thailand", "Bangkok"),
    ("Argentina", "Buenos Aires"),
    ("Chile", "Santiago"),
    ("Cuba", "Havana"),
    ("Hungary", "Budapest"),
    ("Denmark", "Copenhagen"),
    ("Finland", "Helsinki"),
    ("China", "Beijing"),
    ("South Korea", "Seoul"),
    ("Mexico", "Mexico City"),
    ("Belgium", "Brussels"),
    ("Netherlands", "Amsterdam"),
    ("Iran", "Tehran"),
    ("Turkey", "Ankara"),
)

# --- urgency (score): how urgent a ticket is, 3 levels ---------------------------------------------------------------
URGENCY_LEVELS = ("low", "medium", "high")
URGENCY: dict[str, tuple[str, ...]] = {
    "low": (
        "No rush at all, but could you add a dark theme some day?",
        "Whenever you have time, I would like to know how to export my old notes.",
        "Just a suggestion for the future: a bigger font option would be nice.",
        "Not urgent: the logo on the receipt is slightly blurry.",
        "At some point next month I would like to change my invoice address.",
        "A small typo on your help page: 'recieve' should be 'receive'. No hurry.",
        "I am curious whether you plan to support Dutch one day.",
        "When you get a chance, please send me your brochure.",
        "It would be nice to have more colours to choose from. Just an idea.",
        "Low priority: the help page link in the footer points to an old page.",
        "No need to reply soon, but how do I archive old projects?",
        "For next year's planning: do you offer education discounts?",
        "Minor thing: the icon on the settings page is a bit misaligned.",
        "Feel free to answer next week: can I rename my workspace?",
        "Just wondering, is there a keyboard shortcut for search?",
    ),
    "medium": (
        "The export has failed twice this week; please look into it in the next few days.",
        "Our monthly report is due on Friday and the chart page is showing wrong totals.",
        "Some of my colleagues cannot see the shared folder; we need it fixed this week.",
        "The invoice for last month has the wrong amount and our accountant needs it by Thursday.",
        "Uploads are very slow today, it is annoying but we can still work.",
        "Please fix the broken link in our onboarding email before next week's new hires.",
        "The calendar sync has been unreliable for a few days and meetings are getting missed.",
        "One of our five printers stopped working; the others are fine for now.",
        "We need the new user accounts set up before Monday.",
        "The app logs me out several times a day, which slows our team down.",
        "Search results are often incomplete; please investigate this week.",
        "Our order has not shipped yet and we need it by the end of next week.",
        "The mobile app shows yesterday's data until we refresh a few times.",
        "Please correct the VAT on our invoices before the quarter closes in ten days.",
        "A few customers report the checkout is slow; it works, but please check soon.",
    ),
    "high": (
        "URGENT: our whole website is down and customers cannot place orders right now!",
        "Emergency: all our payments are failing at checkout since ten minutes ago.",
        "Production database is not responding; the entire company is blocked. Please help immediately!",
        "Someone is logged into our admin account and deleting data right now!",
        "Critical: the hospital's booking system is offline and patients are waiting.",
        "All our servers went offline and we are losing thousands of euros every minute!",
        "Our live event starts in 15 minutes and the stream is not working at all!",
        "Nobody in the company can log in since this morning. We are completely stopped.",
        "Security breach: customer passwords are visible on our public page. Act now!",
        "The payroll run failed and 500 employees will not be paid today unless this is fixed immediately.",
        "The factory's control app crashed and the production line has stopped. Urgent!",
        "Our shop is charging every customer ten times the price right now. Stop it immediately!",
        "Emergency: the alarm system app is down and the building is unprotected tonight.",
        "All emails to our customers are bouncing and the launch is in one hour!",
        "Immediate help needed: we were hacked and the site shows a ransom message.",
    ),
}

NAMES = ("Anna", "Ben", "Carla")
THINGS = ("marbles", "coins", "stamps", "books", "apples", "stickers")


def _items(set_name: str, kind: str, rows: Sequence[Row]) -> tuple[Item, ...]:
    return tuple(
        Item(set_name, f"{set_name}-{i:03d}", kind, state, question, options, answer)
        for i, (state, question, options, answer) in enumerate(rows, 1)
    )


def _interleave(groups: Mapping[str, tuple[str, ...]]) -> list[tuple[str, str]]:
    """(label, text) taking one of each label in turn, so any prefix of a set is balanced."""
    rows = []
    for i in range(max(len(texts) for texts in groups.values())):
        for label, texts in groups.items():
            if i < len(texts):
                rows.append((label, texts[i]))
    return rows


def build_sets() -> tuple[LabelledSet, ...]:
    """Every set, deterministically (the generated ones from fixed seeds)."""
    sets = []
    rows: list[Row]
    question = "Which team should handle this support ticket?"
    sets.append(
        LabelledSet(
            "tickets",
            "choice",
            "support-ticket routing: the team a written customer message belongs to (4 options)",
            HANDWRITTEN,
            _items("tickets", "choice", [(t, question, TICKET_TEAMS, team) for team, t in _interleave(TICKETS)]),
        )
    )
    question = "What is the sentiment of this review?"
    sets.append(
        LabelledSet(
            "sentiment",
            "choice",
            "sentiment of written product and service reviews: positive, negative or factual (3 options)",
            HANDWRITTEN,
            _items("sentiment", "choice", [(t, question, SENTIMENT_LABELS, s) for s, t in _interleave(SENTIMENT)]),
        )
    )
    question = "Which category does the thing named in the text belong to?"
    rows = [(f"The word is: {word}.", question, CATEGORY_LABELS, c) for c, word in _interleave(CATEGORY_WORDS)]
    sets.append(
        LabelledSet(
            "categories",
            "choice",
            "world knowledge of common nouns: animal, fruit, vehicle or tool (4 options)",
            HANDWRITTEN,
            _items("categories", "choice", rows),
        )
    )
    question = "On which continent is the country named in the text?"
    rows = [(f"The country is {country}.", question, CONTINENT_LABELS, c) for c, country in _interleave(COUNTRIES)]
    sets.append(
        LabelledSet(
            "continents",
            "choice",
            "geography facts: the continent of a country (4 options)",
            HANDWRITTEN,
            _items("continents", "choice", rows),
        )
    )
    rng = random.Random(45)
    rows = []
    for i in range(60):
        counts = rng.sample(range(2, 100), 3)
        thing = THINGS[i % len(THINGS)]
        mentioned = rng.sample(range(3), 3)
        state = ", ".join(f"{NAMES[j]} has {counts[j]} {thing}" for j in mentioned[:2])
        state += f" and {NAMES[mentioned[2]]} has {counts[mentioned[2]]} {thing}."
        winner = NAMES[counts.index(max(counts))]
        rows.append((state, "Who has the most?", tuple((n, None) for n in NAMES), winner))
    sets.append(
        LabelledSet(
            "most",
            "choice",
            "number comparison: who of three people has the largest count (3 options; generated, seed 45)",
            "generated by decision_bench/quality_sets.py (random.Random(45))",
            _items("most", "choice", rows),
        )
    )
    rng = random.Random(4545)
    question = "Is this statement true?"
    rows = []
    for i, (country, capital) in enumerate(CAPITALS):
        if i % 2 == 0:
            rows.append((f"The capital of {country} is {capital}.", question, (), True))
        else:
            other = rng.choice([c for k, c in CAPITALS if k != country])
            rows.append((f"The capital of {country} is {other}.", question, (), False))
    for country, capital in CAPITALS[:10]:
        rows.append((f"{capital} is the capital of {country}.", question, (), True))
    for i, (country, _) in enumerate(CAPITALS[10:20]):
        other = CAPITALS[(i + 3) % 10][1]
        rows.append((f"{other} is the capital of {country}.", question, (), False))
    sets.append(
        LabelledSet(
            "capitals",
            "noul",
            "geography facts as yes/no: is a stated capital right (half true, half another country's capital)",
            HANDWRITTEN + "; the false statements pair countries with other capitals (random.Random(4545))",
            _items("capitals", "noul", rows),
        )
    )
    rng = random.Random(454545)
    rows = [(f"The number is {n}.", "Is the number even?", (), n % 2 == 0) for n in rng.sample(range(10, 1000), 40)]
    sets.append(
        LabelledSet(
            "even",
            "noul",
            "arithmetic as yes/no: is a number between 10 and 999 even (generated, seed 454545)",
            "generated by decision_bench/quality_sets.py (random.Random(454545))",
            _items("even", "noul", rows),
        )
    )
    levels: Options = tuple((level, None) for level in URGENCY_LEVELS)
    question = "How urgent is this support ticket?"
    rows = [(t, question, levels, URGENCY_LEVELS.index(u)) for u, t in _interleave(URGENCY)]
    sets.append(
        LabelledSet(
            "urgency",
            "score",
            "urgency of a support ticket on three levels (low, medium, high), with unmistakable cues",
            HANDWRITTEN,
            _items("urgency", "score", rows),
        )
    )
    return tuple(sets)


def validate(item: Item) -> None:
    """Raises ValueError when an item does not fit its type's schema."""
    where = f"{item.id}"
    if item.kind not in KINDS:
        raise ValueError(f"{where}: type {item.kind!r} is not one of {KINDS}")
    if not item.state.strip() or not item.question.strip():
        raise ValueError(f"{where}: empty state or question")
    names = item.names
    if len(set(names)) != len(names):
        raise ValueError(f"{where}: repeated option names {names}")
    if item.kind == "choice":
        if not 3 <= len(names) <= 4:
            raise ValueError(f"{where}: a choice needs 3-4 options, got {len(names)}")
        if not isinstance(item.answer, str) or item.answer not in names:
            raise ValueError(f"{where}: answer {item.answer!r} is not an option")
    elif item.kind == "noul":
        if names or not isinstance(item.answer, bool):
            raise ValueError(f"{where}: a yes/no item has no options and a true/false answer")
    else:
        if not 2 <= len(names) <= 10:
            raise ValueError(f"{where}: a score needs 2-10 levels, got {len(names)}")
        if isinstance(item.answer, bool) or not isinstance(item.answer, int) or not 0 <= item.answer < len(names):
            raise ValueError(f"{where}: answer {item.answer!r} is not a level index")


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    manifest = []
    for labelled in build_sets():
        path = directory / f"{labelled.name}.jsonl"
        path.write_text("".join(json.dumps(item.to_json(), ensure_ascii=False) + "\n" for item in labelled.items))
        written.append(path)
        manifest.append(
            {
                "name": labelled.name,
                "type": labelled.kind,
                "items": len(labelled.items),
                "measures": labelled.measures,
                "provenance": labelled.provenance,
                "licence": "Apache-2.0",
                "file": path.name,
            }
        )
    index = directory / "sets.json"
    index.write_text(json.dumps({"sets": manifest}, indent=1) + "\n")
    written.append(index)
    return written


def load(directory: Path = DATA_DIR, names: list[str] | None = None) -> tuple[LabelledSet, ...]:
    """The sets as written under `directory` (sets.json names them), each item validated."""
    manifest = json.loads((directory / "sets.json").read_text())["sets"]
    sets = []
    for entry in manifest:
        if names and entry["name"] not in names:
            continue
        rows = [json.loads(line) for line in (directory / entry["file"]).read_text().splitlines() if line.strip()]
        items = tuple(Item.from_json(row) for row in rows)
        for item in items:
            validate(item)
            if item.kind != entry["type"] or item.set != entry["name"]:
                raise ValueError(f"{item.id}: its type/set disagree with sets.json's {entry['name']!r}")
        sets.append(LabelledSet(entry["name"], entry["type"], entry["measures"], entry["provenance"], items))
    if names:
        missing = set(names) - {s.name for s in sets}
        if missing:
            raise ValueError(f"--sets: no set named {sorted(missing)} (have {[e['name'] for e in manifest]})")
        sets.sort(key=lambda s: names.index(s.name))  # in the order asked for
    return tuple(sets)


def fit_split(item_id: str, fraction: float) -> bool:
    """Whether an item belongs to the calibration fit split: a stable hash of its id, so the split never moves."""
    return zlib.crc32(item_id.encode()) % 1000 < fraction * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="decision_bench.quality_sets", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", type=Path, nargs="?", const=DATA_DIR, help=f"Write the sets (default {DATA_DIR})")
    args = parser.parse_args(argv)
    if args.write:
        for path in write(args.write):
            print(path)
    else:
        for labelled in build_sets():
            print(f"{labelled.name}: {len(labelled.items)} {labelled.kind} items; {labelled.measures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
