"""A decision over plain HTTP (Python's standard library only): one state, three question types, the probabilities.

python examples/raw_http.py --url http://127.0.0.1:3000
"""

from __future__ import annotations

import argparse
import json
import urllib.request

REQUEST = {
    "state": {"ticket": "I was charged twice and the refund has not arrived.", "days_open": 12},
    "questions": {
        "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "payments", "tech": None}},
        "urgent": {"type": "noul", "instructions": "Needs a reply within the hour?"},
        "tone": {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "furious"]},
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    args = parser.parse_args()
    request = urllib.request.Request(
        f"{args.url}/v1/systemone",
        data=json.dumps(REQUEST).encode(),
        headers={"content-type": "application/json", "x-request-id": "example-raw-http"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.load(response)
        print("request id:", response.headers["x-request-id"])
    team, urgent, tone = (answer["answers"][q] for q in ("team", "urgent", "tone"))
    print(f"team: {team['choice']} {team['probabilities']}")
    print(f"urgent: P(true) = {urgent['noul']:.3f}")
    print(f"tone: score {tone['score']:.2f} of 0..2, {tone['probabilities']}")


if __name__ == "__main__":
    main()
