"""OpenAI's Python SDK (`pip install openai`): `client.decisions.create` on this server's /v1/decisions.

python examples/openai_sdk.py --url http://127.0.0.1:3000
"""

from __future__ import annotations

import argparse

from openai import OpenAI


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    args = parser.parse_args()
    client = OpenAI(base_url=f"{args.url}/v1", api_key="any", max_retries=0, timeout=120)
    decision = client.decisions.create(
        model="default",
        input="I was charged twice and the refund has not arrived.",
        questions=[
            {"type": "predicate", "instructions": "Is the customer asking for money back?", "name": "refund"},
            {
                "type": "choice",
                "instructions": "Which team?",
                "choices": [{"value": "billing", "description": "payments"}, {"value": "tech"}],
            },
        ],
    )
    refund, team = decision.answers
    print(f"refund: P(true) = {refund.probability:.3f}")
    print("team:", {p.value: round(p.probability, 3) for p in team.probabilities})


if __name__ == "__main__":
    main()
