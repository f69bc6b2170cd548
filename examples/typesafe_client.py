"""The official TypeSafe Python SDK (`pip install typesafe-sdk`) against this server, unchanged but for its base URL.

python examples/typesafe_client.py --url http://127.0.0.1:3000
"""

from __future__ import annotations

import argparse

from typesafe_sdk import Choice, Noul, Score, TypeSafeClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    args = parser.parse_args()
    with TypeSafeClient(base_url=args.url, api_key="any") as client:  # any key unless the server has --api-key
        result = client.system_one(
            state="I was charged twice and the refund has not arrived.",
            questions={
                "team": Choice(instructions="Which team?", criteria={"billing": "payments", "tech": None}),
                "urgent": Noul(instructions="Needs a reply within the hour?"),
                "tone": Score(instructions="How upset?", criteria=["calm", "annoyed", "furious"]),
            },
        )
    print("request id:", result.request_id)
    print(f"team: {result.choices['team'].choice} {result.choices['team'].probabilities}")
    print(f"urgent: P(true) = {result.nouls['urgent'].noul:.3f}")
    print(f"tone: score {result.scores['tone'].score:.2f} {result.scores['tone'].legend}")


if __name__ == "__main__":
    main()
