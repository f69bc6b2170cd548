"""Token counts for sizing states and for the naive-cost estimate (Σ per-question prompt tokens).

With a model folder the counts come from its tokenizer.json and chat template; without, ~4 characters a token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

CHARS_PER_TOKEN = 4.0
# Without a chat template, what a chat head plus reply header costs, roughly (SmolLM2's is about 30 tokens).
FALLBACK_TEMPLATE_TOKENS = 30


class TokenCounter(Protocol):
    source: str

    def count(self, text: str) -> int: ...

    def count_many(self, texts: list[str]) -> list[int]: ...

    def prompt_overhead(self, sample_state: str, body: str) -> int:
        """Tokens of one rendered per-question prompt beyond the state's own tokens."""
        ...


class CharCounter:
    """~4 characters per token: good enough to size a state when no tokenizer is at hand."""

    source = "chars/4"

    def count(self, text: str) -> int:
        return max(1, round(len(text) / CHARS_PER_TOKEN)) if text else 0

    def count_many(self, texts: list[str]) -> list[int]:
        return [self.count(text) for text in texts]

    def prompt_overhead(self, sample_state: str, body: str) -> int:
        return self.count("\n\n" + body) + FALLBACK_TEMPLATE_TOKENS


class TokenizerCounter:
    """Exact counts from a model folder's tokenizer.json; prompts rendered with its chat template if jinja2 is there."""

    def __init__(self, model_dir: Path) -> None:
        from tokenizers import Tokenizer  # optional dependency: only needed with --tokenizer

        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"--tokenizer {model_dir}: no tokenizer.json there")
        self._tokenizer = Tokenizer.from_file(str(path))
        self._template = _load_chat_template(model_dir)
        self.source = f"tokenizer.json{' + chat template' if self._template is not None else ''} ({model_dir.name})"

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count_many(self, texts: list[str]) -> list[int]:
        return [len(encoding.ids) for encoding in self._tokenizer.encode_batch(texts, add_special_tokens=False)]

    def prompt_overhead(self, sample_state: str, body: str) -> int:
        content = f"{sample_state}\n\n{body}"
        if self._template is None:
            return self.count(content) - self.count(sample_state) + FALLBACK_TEMPLATE_TOKENS
        rendered = self._template.render(
            messages=[{"role": "user", "content": content}], add_generation_prompt=True, enable_thinking=False
        )
        return self.count(rendered) - self.count(sample_state)


def _load_chat_template(model_dir: Path) -> Any | None:
    text: str | None = None
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        text = jinja_file.read_text()
    else:
        config_file = model_dir / "tokenizer_config.json"
        if config_file.is_file():
            value = json.loads(config_file.read_text()).get("chat_template")
            text = value if isinstance(value, str) else None
    if text is None:
        return None
    try:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        return None
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    environment.filters["tojson"] = lambda value, **_: json.dumps(value, ensure_ascii=False)
    return environment.from_string(text)


def make_counter(model_dir: str | None) -> TokenCounter:
    return TokenizerCounter(Path(model_dir)) if model_dir else CharCounter()
