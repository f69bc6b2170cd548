"""Many decisions at once from one process: the SDK's async client and asyncio.gather. The server batches requests
that arrive together into shared forward passes, so concurrent clients cost less per decision than serial ones.

    python examples/async_client.py --url http://127.0.0.1:3000
"""

from __future__ import annotations

import argparse
import asyncio
import time

from typesafe_sdk import AsyncTypeSafeClient, Choice

TICKETS = [
    "I was charged twice this month.",
    "The app crashes when I upload a photo.",
    "Do you offer a discount for nonprofits?",
    "My password reset email never arrives.",
]
TEAM = Choice(instructions="Which team?", criteria={"billing": "payments", "tech": "bugs and outages", "sales": None})


async def main(url: str) -> None:
    async with AsyncTypeSafeClient(base_url=url, api_key="any") as client:
        started = time.perf_counter()
        results = await asyncio.gather(*(client.system_one(state=t, questions={"team": TEAM}) for t in TICKETS))
        elapsed = time.perf_counter() - started
    for ticket, result in zip(TICKETS, results, strict=True):
        print(f"{result.choices['team'].choice:8} {ticket}")
    print(f"{len(TICKETS)} decisions in {elapsed:.2f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    asyncio.run(main(parser.parse_args().url))
