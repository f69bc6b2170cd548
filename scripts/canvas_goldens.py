"""Goldens for router/src/prompt/canvas.rs, computed the way vLLM 0.33's DiffusionGemmaCanvasStrategy does
(hashlib + random.Random, its joint chunking and layout), on the tiny-diffusiongemma fixture's tokenizer and
template (transformers' apply_chat_template). Run: .venv/bin/python scripts/canvas_goldens.py"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from transformers import AutoTokenizer

FIXTURE = Path.home() / ".cache/decision-inference/models/tiny-diffusiongemma"
THOUGHT = "<|channel>thought\n<channel|>"
JOINT_REPLY = 'Reply with one line per question, in order, formatted as "number: answer".'
LETTERS = [chr(c) for c in range(65, 91)]


def rng(prompt_ids: list[int]) -> random.Random:
    return random.Random(hashlib.sha256(json.dumps(prompt_ids).encode()).digest())


def chunks(rows: list[int], served: int) -> list[tuple[int, int]]:
    n = len(rows)
    for count in range(1, n):
        size, extra = divmod(n, count)
        bounds = [i * size + min(i, extra) for i in range(count + 1)]
        spans = list(zip(bounds, bounds[1:]))
        if all(1 + sum(rows[a:b]) < served for a, b in spans):
            return spans
    return [(k, k + 1) for k in range(n)]


def main() -> None:
    print("noise", [rng([1, 2, 3]).randrange(768), rng([5]).randrange(262144), rng(list(range(300))).randrange(1000)])
    r = rng([7, 8, 9])
    print("sequence", [r.randrange(768) for _ in range(5)], "bound1", rng([4]).randrange(1))
    print("chunks", chunks([4] * 8, 64), chunks([4] * 8, 16), chunks([5, 4, 4, 4, 4], 13), chunks([4] * 3, 5), chunks([4], 16))

    tok = AutoTokenizer.from_pretrained(FIXTURE)
    config = json.loads((FIXTURE / "config.json").read_text())
    vocab, served = config["text_config"]["vocab_size"], config["canvas_length"]
    end, pad = tok.convert_tokens_to_ids("<turn|>"), tok.pad_token_id
    state = json.dumps({"ticket": "Refund not received", "days": 12}, ensure_ascii=False)
    noul_body = "yes\nno\nAnswer with yes or no only."
    single = f"{state}\n\nQuestion: Urgent?\n{noul_body}"
    messages = [{"role": "system", "content": "You route tickets."}, {"role": "user", "content": single}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=False)
    ids = tok.encode(prompt, add_special_tokens=False)
    canvas = [rng(ids).randrange(vocab), end] + [pad] * 14
    print("single prompt", json.dumps(prompt))
    print("single ids", ids)
    print("thought", tok.encode(THOUGHT, add_special_tokens=False))
    print("single canvas", canvas)

    choice_body = "A: billing\nB: tech - broken things\nAnswer with the letter of one option only."
    score_body = "0: calm\n1: angry\nAnswer with the number of one level only."
    asks = [("Urgent?", noul_body, "yes"), ("Team?", choice_body, "A"), (None, score_body, "0")]
    blocks = [f"Question {k}:{' ' + i if i else ''}\n{b}" for k, (i, b, _) in enumerate(asks, 1)]
    content = f"{state}\n\n" + "\n\n".join(blocks) + f"\n\n{JOINT_REPLY}"
    prompt = tok.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False)
    ids = tok.encode(prompt, add_special_tokens=False)
    r = rng(ids)
    joint: list[int] = []
    positions = []
    newline = tok.encode("\n", add_special_tokens=False)
    for k, (_, _, first) in enumerate(asks, 1):
        joint += tok.encode(f"{k}: {first}", add_special_tokens=False)[:-1]
        positions.append(len(joint))
        joint += [r.randrange(vocab), *newline]
    joint.append(end)
    width = min(-(-(len(joint) + 1) // 16) * 16, served)
    joint += [pad] * (width - len(joint))
    print("joint content", json.dumps(content))
    print("joint ids", ids)
    print("joint canvas", joint, "positions", positions)
    slot = {x: tok.encode(f"1: {x}", add_special_tokens=False)[-1] for x in ["yes", "no", "A", "B", "0", "1"]}
    alone = {x: tok.encode(x, add_special_tokens=False)[0] for x in slot}
    print("slot ids", slot, "alone", alone)


if __name__ == "__main__":
    main()
