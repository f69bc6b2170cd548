"""Pin and replay a decision: ask /v1/decisions (SGLang's shape) for the prompt's token ids, then send them to
/v1/score and get the same probabilities back: the exact prompt is kept for audits, not re-rendered.

    python examples/score_replay.py --url http://127.0.0.1:3000
"""

from __future__ import annotations

import argparse
import json
import urllib.request


def post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        result: dict[str, object] = json.load(response)
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:3000")
    args = parser.parse_args()
    question = {"id": "urgent", "type": "yes_no", "question": "Does this need a reply within the hour?"}
    decided = post(
        f"{args.url}/v1/decisions",
        {"input": "The refund still has not arrived.", "questions": [question], "return_prompt_token_ids": True},
    )
    answer = decided["answers"]["urgent"]  # type: ignore[index]
    replay = post(
        f"{args.url}/v1/score",
        {
            "query": [],
            "items": [answer["prompt_token_ids"]],
            "label_token_ids": [answer["label_token_ids"]],
            "apply_softmax": True,
        },
    )
    decision = list(answer["probabilities"].values())
    scores = replay["scores"][0]  # type: ignore[index]
    print("decision:", [round(p, 6) for p in decision])
    print("replayed:", [round(p, 6) for p in scores])
    print("max difference:", max(abs(a - b) for a, b in zip(decision, scores, strict=True)))


if __name__ == "__main__":
    main()
