"""Seed sentences as tests: every testable sentence of the three seeds (000 and 001: vLLM's pages, 003: SGLang's), in
the profile the seed describes. `SENTENCES` is the list; each one is tested by a table case here (the case id starts
with "{seed} {section}: {sentence}"), by a named test elsewhere, by the same sentence of seed 000, or is listed as
untested with the reason. docs/profiles.md's coverage table is generated from it (`python test_seed_sentences.py`)
and `test_the_coverage_table_in_docs_matches_the_sentence_list` keeps the two equal. The servers read the tiny Qwen3
fixture (real Qwen3 tokenizer and template) under `--compat typesafe`, `vllm` and `sglang`."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx2
import pytest

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "profiles.md"

pytestmark = pytest.mark.local_only


class Sentence(NamedTuple):
    seed: str
    section: str
    text: str
    # "case": table cases below; "file.py::test" (integration-tests/) or "router/src/…rs::fn": a test elsewhere;
    # "=000": the same sentence in seed 000 (001 repeats most of 000); "untested: reason".
    where: str

    @property
    def key(self) -> str:
        return f"{self.seed} {self.section}: {self.text}"


HERE_CASE = "case"
UNSHIPPABLE = "untested: needs the real checkpoint, which a CPU test cannot load (the tiny fixture has random weights)"
S = Sentence
SENTENCES: list[Sentence] = [
    # ---- seed 000 (vLLM: Structured Decisions Models) ----
    S("000", "Supported models", "Qwen3ForCausalLM is read by NextTokenStrategy", "test_architectures.py::test_info_names_architecture_strategy_and_engine"),
    S("000", "Supported models", "ClefFlashForJointSchema / ClefOmniForJointSchema are read by a joint schema head", "test_clef.py::test_info_names_the_clef_strategy"),
    S("000", "Supported models", "Lfm2VlForConditionalGeneration is read by LiquidStrategy", "test_architectures.py::test_info_names_architecture_strategy_and_engine"),
    S("000", "Supported models", "Qwen3_5 and Qwen3_5Moe are read by NextTokenStrategy", "test_architectures.py::test_info_names_architecture_strategy_and_engine"),
    S("000", "Supported models", "DiffusionGemmaForBlockDiffusion is read by DiffusionGemmaCanvasStrategy", "test_canvas.py::test_info_names_the_canvas_strategy_and_engine"),
    S("000", "System One endpoint", "The /v1/systemone endpoint answers a set of typed questions about a state and returns a probability for every allowed answer", "test_seed_sentences.py::test_000_the_example_request_answers_as_the_example_response"),
    S("000", "System One endpoint", "The endpoint is available by default on generation models", HERE_CASE),
    S("000", "System One endpoint", "Models without a supported read strategy return 501", "test_clef.py::test_refusals"),
    S("000", "System One endpoint", "Supported architectures require --logprobs-mode raw_logprobs or processed_logprobs", "untested: a vLLM engine flag; our shards always return log-probabilities, there is no such mode to set"),
    S("000", "How it works", "Each question is one read", "test_profiles.py::test_vllm_and_sglang_profiles"),
    S("000", "How it works", "The user message is the state, followed by the question and its options with the type's labels, and an instruction to answer with one label", "router/src/prompt/wording.rs::spec_example_choice_with_json_state"),
    S("000", "How it works", "The read is the reply's first token", "router/src/prompt/next_token.rs::qwen3_reply_prefix_is_after_the_empty_think_block"),
    S("000", "How it works", "Each label must be one token there, or the request returns 400", "router/src/profile.rs::label_refusals_are_400_under_vllm_and_unservable_models_501"),
    S("000", "How it works", "Softmax over the labels gives the answer's probabilities", "test_systemone.py::test_all_three_types_match_the_reference"),
    S("000", "How it works", "Thinking is off unless chat_template_kwargs turns it on", HERE_CASE),
    S("000", "How it works", "Probabilities can differ between identical requests (batch composition, prefix cache)", "untested: a permission, not a requirement; ours do not move with the batch (test_systemone.py::test_invariant_under_concurrent_requests)"),
    S("000", "How it works", "Every read of a request starts with the state, so with --enable-prefix-caching the state is prefilled once", "untested: a performance statement about vLLM's prefix cache flag; our shared-prefix reads are checked for equality in server/tests, not by a wire test"),
    S("000", "Question types", "choice answers choice, probabilities by option name, confidence", "test_seed_sentences.py::test_000_the_example_request_answers_as_the_example_response"),
    S("000", "Question types", "noul criteria is null, or an object with optional true and false descriptions", HERE_CASE),
    S("000", "Question types", "noul answers noul (probability of yes), probabilities, confidence", "test_seed_sentences.py::test_000_the_example_request_answers_as_the_example_response"),
    S("000", "Question types", "score answers score (expected 0-indexed level), legend, probabilities by level index, confidence", "test_seed_sentences.py::test_000_the_example_request_answers_as_the_example_response"),
    S("000", "Question types", "A choice has at least one option", HERE_CASE),
    S("000", "Question types", "a score at least two levels", HERE_CASE),
    S("000", "Question types", "A question id is a non-empty string", HERE_CASE),
    S("000", "Example", "The example request answers with the example response's fields (id, object, created, model, answers, usage, diagnostics)", "test_seed_sentences.py::test_000_the_example_request_answers_as_the_example_response"),
    S("000", "Example", "diagnostics.label_mass is the probability the model put on the labels across its whole vocabulary", "test_systemone.py::test_all_three_types_match_the_reference"),
    S("000", "Example", "confidence is the chosen option's probability over the whole vocabulary: its share of the labels times label_mass", "test_seed_sentences.py::test_000_the_example_request_answers_as_the_example_response"),
    S("000", "Labels", "a choice labels its options A to Z in the order the request lists them", "router/src/prompt/wording.rs::labels_follow_request_order"),
    S("000", "Labels", "a noul labels its options yes and no", "router/src/prompt/wording.rs::yes_no_always_has_both_sides_yes_first"),
    S("000", "Labels", "a score labels its levels 0 to 9, so a level's label is its score", "router/src/prompt/wording.rs::score_levels_are_numbered"),
    S("000", "Limits", "questions per request 64", HERE_CASE),
    S("000", "Limits", "options per choice 26", HERE_CASE),
    S("000", "Limits", "levels per score 10", HERE_CASE),
    S("000", "Request fields", "state: a string, or JSON that is sent as its JSON text", "test_systemone.py::test_object_state_is_rendered_as_json"),
    S("000", "Request fields", "questions: question id to {type, instructions, criteria}, asked in this order", "test_seed_sentences.py::test_000_the_example_request_answers_as_the_example_response"),
    S("000", "Request fields", "instructions: optional context placed ahead of the questions", "router/src/prompt/chat.rs::instructions_are_a_system_message_or_lead_the_user_message"),
    S("000", "Request fields", "chat_template_kwargs: passed to the chat template", HERE_CASE),
    S("000", "Request fields", "cache_salt: optional prefix-cache salt applied to every question", HERE_CASE),
    S("000", "Request fields", "images, audio, videos: optional media URLs or data URLs, for models that take them", HERE_CASE),
    S("000", "Request fields", "A question with any field other than type, instructions and criteria is rejected with a 400", HERE_CASE),
    S("000", "Request fields", "traceparent and tracestate headers are forwarded to every question's generation request", "test_tracing.py::test_one_trace_spans_the_caller_the_router_and_the_shard"),
    S("000", "OpenAI Decisions API", "vLLM provides a text-only implementation of OpenAI's POST /v1/decisions API (the SDK example)", "test_seed_sentences.py::test_000_the_openai_example_answers_in_question_order"),
    S("000", "OpenAI Decisions API", "Use OpenAI Python SDK 3.26.0 or newer for client.decisions.create", "test_decisions.py::test_openai_client_reads_every_question_type"),
    S("000", "OpenAI Decisions API", "The request contract follows the OpenAI OpenAPI schemas retrieved on October 7, 2026", "untested: that schema is not in the seeds; the official SDK's request and response types stand in for it (test_decisions.py)"),
    S("000", "OpenAI Decisions API", "input accepts a string or an array of user messages with string content or input_text parts", HERE_CASE),
    S("000", "OpenAI Decisions API", "Answers retain question order and echo name, including null for unnamed questions", "test_seed_sentences.py::test_000_the_openai_example_answers_in_question_order"),
    S("000", "OpenAI Decisions API", "Choice values preserve strings and booleans", "test_seed_sentences.py::test_000_openai_choice_values_preserve_strings_and_booleans"),
    S("000", "OpenAI Decisions API", "Scores are probability-weighted averages of zero-based level indices", "test_seed_sentences.py::test_000_the_openai_example_answers_in_question_order"),
    S("000", "OpenAI Decisions API", "This MVP supports 1-64 questions", HERE_CASE),
    S("000", "OpenAI Decisions API", "2-26 choices", HERE_CASE),
    S("000", "OpenAI Decisions API", "2-10 score levels", HERE_CASE),
    S("000", "OpenAI Decisions API", "Upstream permits 200 questions and 255 choices", HERE_CASE),
    S("000", "OpenAI Decisions API", "The optional safety_identifier is caller metadata", HERE_CASE),
    S("000", "OpenAI Decisions API", "safety_identifier is available in request body logging with --enable-log-requests; it does not authenticate callers", "untested: --enable-log-requests is a vLLM flag this server does not have; the field is accepted as metadata (previous sentence) and authentication is --api-key only"),
    S("000", "Implementation and limits", "It supports generation architectures with a registered read strategy, including Qwen, DiffusionGemma, and Liquid d1", "test_architectures.py::test_decisions_routes_answer_in_both_shapes"),
    S("000", "Implementation and limits", "unsupported models return 501", "test_clef.py::test_refusals"),
    S("000", "Implementation and limits", "Usage reports the actual prompt and output tokens across these reads, including prefix-cache counters", "test_seed_sentences.py::test_000_the_openai_example_answers_in_question_order"),
    S("000", "Implementation and limits", "Probabilities are normalized over the supplied options", "test_seed_sentences.py::test_000_the_openai_example_answers_in_question_order"),
    S("000", "Implementation and limits", "confidence is the winning label's probability over the full vocabulary", "test_seed_sentences.py::test_000_the_openai_example_answers_in_question_order"),
    S("000", "Implementation and limits", "Thinking is disabled for these reads", HERE_CASE),
    S("000", "Implementation and limits", "Image inputs are outside this MVP", HERE_CASE),
    S("000", "Implementation and limits", "other message roles are outside this MVP", HERE_CASE),
    S("000", "Implementation and limits", "tools, streaming are outside this MVP", HERE_CASE),
    S("000", "Implementation and limits", "per-question refusal scoring is outside this MVP", "untested: there is nothing to send: no request field asks for refusal scoring (an unknown field is covered by the next sentence)"),
    S("000", "Implementation and limits", "Unsupported request fields and input types are rejected", HERE_CASE),
    S("000", "Implementation and limits", "The /v1/systemone endpoint retains its existing request format and is available by default", HERE_CASE),
    S("000", "Clef-Flash", "vLLM detects the head and serves the checkpoint as a pooling model", "test_clef.py::test_info_names_the_clef_strategy"),
    S("000", "Clef-Flash", "choice, noul and score questions are supported", "test_clef.py::test_systemone_equals_the_head_on_the_reference_prompt"),
    S("000", "Clef-Flash", "Text and JSON states use the checkpoint's fixed prompt; JSON is compact with sorted keys", "router/src/prompt/joint_schema.rs::golden_prompt_and_spans"),
    S("000", "Clef-Flash", "instructions returns 400; chat_template_kwargs has no effect", "test_clef.py::test_refusals"),
    S("000", "Clef-Flash", "The state is truncated to fit 16,384 tokens, or max_model_len if smaller", "test_clef.py::test_a_long_state_is_truncated_from_its_end"),
    S("000", "Clef-Flash", "A schema that exceeds this bound returns 400", "router/src/prompt/joint_schema.rs::truncation_and_refusals"),
    S("000", "Clef-Flash", "images and videos are placed before the state; videos sampled at 2 fps", "test_clef.py::test_an_image_is_read_and_counted"),
    S("000", "Clef-Flash", "Audio inputs return 400, and video soundtracks are ignored", "test_clef.py::test_videos_and_audio_as_the_seeds_say"),
    S("000", "Clef-Flash", "usage.input_tokens counts the prompt once, output_tokens is 0, and label_mass is 1", "test_clef.py::test_systemone_equals_the_head_on_the_reference_prompt"),
    S("000", "Clef-Omni", "A request is one read; the prompt is the state, then every question with its options; JSON compact with sorted keys", "test_clef.py::test_systemone_equals_the_head_on_the_reference_prompt"),
    S("000", "Clef-Omni", "A state too long for the model is truncated to fit", "test_clef.py::test_a_long_state_is_truncated_from_its_end"),
    S("000", "Clef-Omni", "A request whose questions alone exceed 64,000 tokens, or max_model_len, returns 400", "router/src/prompt/joint_schema.rs::truncation_and_refusals"),
    S("000", "Clef-Omni", "instructions returns 400, since the prompt is fixed. chat_template_kwargs has no effect", "test_clef.py::test_refusals"),
    S("000", "Clef-Omni", "label_mass is 1 and confidence is the chosen option's probability; input_tokens counts the prompt once, output_tokens 0", "test_clef.py::test_systemone_equals_the_head_on_the_reference_prompt"),
    S("000", "Clef-Omni", "a video's soundtrack is heard with it when every video has one; audio clips cannot be sent with videos that have soundtracks", "test_clef.py::test_videos_and_audio_as_the_seeds_say"),
    S("000", "Liquid d1", "picks and probabilities match model.system_one()", UNSHIPPABLE),
    S("000", "Liquid d1", "A JSON state is written as indented JSON", "router/src/prompt/liquid.rs::choice_with_an_indented_json_state"),
    S("000", "Liquid d1", "A null state leaves the images, or the question alone, as the prompt", "router/src/prompt/liquid.rs::null_state_and_a_missing_side_printed_as_none"),
    S("000", "Liquid d1", "images are placed before the state and shrunk to at most 1024 x 1024 pixels", "test_media.py::test_images_equal_an_independent_processor_forward"),
    S("000", "Liquid d1", "A choice whose option names are all single letters is labeled with those letters", "router/src/prompt/liquid.rs::single_letter_names_are_their_own_codes"),
    S("000", "Liquid d1", "--no-enable-prefix-caching lowers latency for one question per changing state", "untested: a latency tip about a vLLM flag; nothing on the wire to check"),
    # ---- seed 001 (vLLM: Structured Decisions; repeats 000's System One sections) ----
    S("001", "System One endpoint", "The /v1/systemone endpoint answers a set of typed questions about a state and returns a probability for every allowed answer", "=000"),
    S("001", "System One endpoint", "The endpoint is available by default on generation models", "=000"),
    S("001", "System One endpoint", "Models without a supported read strategy return 501", "=000"),
    S("001", "System One endpoint", "Supported architectures require --logprobs-mode raw_logprobs or processed_logprobs", "=000"),
    S("001", "How it works", "Each question is one read", "=000"),
    S("001", "How it works", "The user message is the state, followed by the question and its options with the type's labels, and an instruction to answer with one label", "=000"),
    S("001", "How it works", "The read is the reply's first token", "=000"),
    S("001", "How it works", "Each label must be one token there, or the request returns 400", "=000"),
    S("001", "How it works", "Softmax over the labels gives the answer's probabilities", "=000"),
    S("001", "How it works", "Thinking is off unless chat_template_kwargs turns it on", "=000"),
    S("001", "Question types", "noul criteria is null, or an object with optional true and false descriptions", "=000"),
    S("001", "Question types", "A choice has at least one option", "=000"),
    S("001", "Question types", "a score at least two levels", "=000"),
    S("001", "Question types", "A question id is a non-empty string", "=000"),
    S("001", "Example", "The example request answers with the example response's fields (id, object, created, model, answers, usage, diagnostics)", "=000"),
    S("001", "Example", "confidence is the chosen option's probability over the whole vocabulary: its share of the labels times label_mass", "=000"),
    S("001", "Limits", "questions per request 64", "=000"),
    S("001", "Limits", "options per choice 26", "=000"),
    S("001", "Limits", "levels per score 10", "=000"),
    S("001", "Request fields", "images, audio, videos: optional media URLs or data URLs, for models that take them", "=000"),
    S("001", "Request fields", "A question with any field other than type, instructions and criteria is rejected with a 400", "=000"),
    S("001", "Clef-Omni", "A request whose questions alone exceed 64,000 tokens, or max_model_len, returns 400", "=000"),
    S("001", "Clef-Omni", "instructions returns 400, since the prompt is fixed. chat_template_kwargs has no effect", "=000"),
    S("001", "Liquid d1", "A JSON state is written as indented JSON", "=000"),
    S("001", "Liquid d1", "A choice whose option names are all single letters is labeled with those letters", "=000"),
    # ---- seed 003 (SGLang: Decision models) ----
    S("003", "Overview", "each answer comes back with the probability of every option, read from the model's next-token scores at the answer position", "test_seed_sentences.py::test_003_the_example_request_answers_every_type"),
    S("003", "Supported models", "Qwen3.8-27B and Qwen3.5-35B-A3B validated on one H200 in BF16", "untested: needs the 27B / 35B checkpoints (not shippable, GPU-sized); tiny random Qwen3, Qwen3.5 and Qwen3.5-MoE fixtures stand in (test_architectures.py)"),
    S("003", "Supported models", "The server checks these per request and returns a 400 that names the reason when one fails", HERE_CASE),
    S("003", "Supported models", "inspect prompt_token_ids from return_prompt_token_ids", "test_seed_sentences.py::test_003_the_example_request_answers_every_type"),
    S("003", "Launch", "No extra flag is needed", HERE_CASE),
    S("003", "Launch", "The same server keeps serving /v1/chat/completions and /generate", "untested: deliberate difference: this server has no generation routes (docs/profiles.md)"),
    S("003", "Launch", "A server launched with --enable-mis or --dllm-algorithm, or a built-in conversation template, refuses decisions", "untested: those flags and built-in templates do not exist here; every model reads through its own Jinja template"),
    S("003", "Example", "probabilities: one value per option name, level index, or yes and no, summing to 1; probabilities[yes] is the answer", "test_seed_sentences.py::test_003_the_example_request_answers_every_type"),
    S("003", "Example", "choice (the most probable option) or score (the probability-weighted mean level index)", "test_seed_sentences.py::test_003_the_example_request_answers_every_type"),
    S("003", "Example", "label_mass: the full-vocabulary probability of the answer labels at the answer position", "test_profiles.py::test_vllm_and_sglang_profiles"),
    S("003", "Example", "Questions are answered independently and scored together in one batch", "test_seed_sentences.py::test_003_questions_are_answered_independently"),
    S("003", "How answers are computed", "renders each question as one user message with the chat template and thinking turned off", "test_seed_sentences.py::test_003_thinking_stays_off_the_prompt_closes_the_think_block"),
    S("003", "How answers are computed", "labels the answers A to Z for options, 0 to 9 for levels, and yes and no", "router/src/prompt/wording.rs::sglang_wording"),
    S("003", "How answers are computed", "runs one prefill pass per question through the scoring path of /v1/score", "test_decisions.py::test_a_decision_replays_through_v1_score"),
    S("003", "How answers are computed", "probabilities[yes] = exp(lp_yes / T) / (exp(lp_yes / T) + exp(lp_no / T))", "test_seed_sentences.py::test_003_temperature_divides_the_label_logits_and_not_label_mass"),
    S("003", "How answers are computed", "label_mass = exp(lp_yes) + exp(lp_no), which does not depend on T", "test_seed_sentences.py::test_003_temperature_divides_the_label_logits_and_not_label_mass"),
    S("003", "How answers are computed", "Choice and score questions work the same way over their labels", "test_seed_sentences.py::test_003_temperature_divides_the_label_logits_and_not_label_mass"),
    S("003", "Request fields", "input: objects and arrays are rendered as compact JSON", "test_seed_sentences.py::test_003_object_and_array_inputs_render_as_compact_json"),
    S("003", "Request fields", "input must not be blank", HERE_CASE),
    S("003", "Request fields", "questions: at least one", HERE_CASE),
    S("003", "Request fields", "Each question has a unique id, which keys its answer", "test_seed_sentences.py::test_003_the_example_request_answers_every_type"),
    S("003", "Request fields", "temperature: number above 0, default 1", HERE_CASE),
    S("003", "Request fields", "chat_template_kwargs: the thinking toggle stays off", HERE_CASE),
    S("003", "Request fields", "prompt_format_version pins the prompt wording", HERE_CASE),
    S("003", "Request fields", "return_prompt_token_ids adds prompt_token_ids and label_token_ids to each answer", "test_seed_sentences.py::test_003_the_example_request_answers_every_type"),
    S("003", "Request fields", "model is echoed in the response, as default when omitted", "test_seed_sentences.py::test_003_model_is_echoed_as_default_when_omitted"),
    S("003", "Request fields", "the base:adapter form returns 400", HERE_CASE),
    S("003", "Question fields", "choice: 2 to 26 objects with a name and an optional description", HERE_CASE),
    S("003", "Question fields", "score: 2 to 10 level descriptions, lowest first", HERE_CASE),
    S("003", "Question fields", "yes_no: optional yes and no descriptions", "test_seed_sentences.py::test_003_yes_and_no_descriptions_are_read"),
    S("003", "Question fields", "question, descriptions, and levels can also be JSON objects or arrays", "test_seed_sentences.py::test_003_question_descriptions_and_levels_may_be_json"),
    S("003", "Question fields", "Each question becomes one user message: the input, a blank line, the question line, one line per option, and a closing instruction", "test_profiles.py::test_vllm_and_sglang_profiles"),
    S("003", "Question fields", "An option renders as A: billing or A: billing - <description>, a level as 0: <description>, yes: <description>", "router/src/prompt/wording.rs::sglang_wording"),
    S("003", "Response", "object decisions, model, prompt_format_version, answers keyed by question id, usage prompt_tokens for all questions and completion_tokens 0", "test_seed_sentences.py::test_003_the_example_request_answers_every_type"),
    S("003", "Response", "score probabilities are keyed by level index (equal level texts stay apart)", "test_seed_sentences.py::test_003_score_probabilities_are_keyed_by_level_index"),
    S("003", "Errors", "an unknown question type", HERE_CASE),
    S("003", "Errors", "an unknown field anywhere in the request", HERE_CASE),
    S("003", "Errors", "option or level counts outside the ranges above", HERE_CASE),
    S("003", "Errors", "a blank input", HERE_CASE),
    S("003", "Errors", "a blank question", HERE_CASE),
    S("003", "Errors", "a blank question id", HERE_CASE),
    S("003", "Errors", "a blank level", HERE_CASE),
    S("003", "Errors", "a repeated question id", HERE_CASE),
    S("003", "Errors", "option names that are blank", HERE_CASE),
    S("003", "Errors", "option names that contain control or line break characters", HERE_CASE),
    S("003", "Errors", "option names that repeat another name after trimming and case folding", HERE_CASE),
    S("003", "Errors", "a label that is not one distinct token at the answer position for the served tokenizer", HERE_CASE),
    S("003", "Errors", "a prompt that does not fit the model's context length", HERE_CASE),
    S("003", "Errors", "a chat template that always thinks before answering or starts every answer with a reasoning block", "router/src/prompt/chat.rs::reasoning_block_detection"),
    S("003", "Errors", "chat_template_kwargs that set the thinking toggle to anything but false", HERE_CASE),
    S("003", "Errors", "a rendered prompt that leaves a reasoning block open", "router/src/prompt/chat.rs::reasoning_block_detection"),
    S("003", "Errors", "a model whose reasoning parser expects answers to start inside a reasoning block when the prompt does not close one", "untested: there is no --reasoning-parser here; the rendered prompt itself is checked (previous sentence)"),
    S("003", "Errors", "a prompt_format_version other than the served one", HERE_CASE),
    S("003", "Errors", "a model that names a LoRA adapter", HERE_CASE),
    S("003", "Errors", "a server launched with --enable-mis or --dllm-algorithm, or a built-in conversation template", "untested: no such flags or built-in templates here"),
    S("003", "Errors", "a tokenizer that does not encode the rendered chat text back to the same ids, or a model that is not a generation model", "untested: needs a tokenizer that does not round-trip; the fixtures' tokenizers all do"),
    S("003", "Errors", "a chat template that raises an error for the question message, or --skip-tokenizer-init", "untested: needs a template that raises; no fixture has one (a raise is a 400 naming chat_template_kwargs, router/src/prompt/chat.rs)"),
    S("003", "Errors", "Errors about one question name its id or its position in questions", HERE_CASE),
    S("003", "Pin and replay", "Every response carries prompt_format_version", "test_seed_sentences.py::test_003_the_example_request_answers_every_type"),
    S("003", "Pin and replay", "The replayed scores equal the answer's probabilities when both requests use the same temperature", "test_decisions.py::test_a_decision_replays_through_v1_score"),
    S("003", "Pin and replay", "A replay right after the decision reuses its cached prefix, so it can differ slightly", "test_decisions.py::test_a_decision_replays_through_v1_score"),
    S("003", "Pin and replay", "/v1/score: token ids outside the vocabulary, empty items, over-long items are a 400 naming the item", "test_decisions.py::test_v1_score_refusals_name_the_item"),
    S("003", "Thinking models", "/v1/decisions turns thinking off for every question, refuses a request that turns it back on", HERE_CASE),
    S("003", "Thinking models", "refuses a rendered prompt that leaves a reasoning block open, so the answer is never read inside the reasoning", "test_seed_sentences.py::test_003_thinking_stays_off_the_prompt_closes_the_think_block"),
    S("003", "Thinking models", "Chat requests to the same server keep the model's default, and --reasoning-parser qwen3 affects chat only", "untested: this server has no chat route and no --reasoning-parser"),
    S("003", "Reproducibility", "probabilities move by up to 0.07 between cold and cached requests on these hybrid models", "untested: measured on Qwen3.5-35B-A3B on a GPU; our fork engine reads hybrids exactly (test_architectures.py compares tiny Qwen3.5 with transformers)"),
    S("003", "System One compatible API", "POST /v1/systemone serves the same decisions in the System One shape (same rendering, label checks and scoring)", "test_profiles.py::test_vllm_and_sglang_profiles"),
    S("003", "System One compatible API", "Clients written for that API, including the official TypeSafe SDKs, get decisions by pointing their base URL at the server", "test_sdk.py::test_sdk_parses_all_three_answer_types"),
    S("003", "System One compatible API", "refuses the same prompts (a prompt over the context is a 400)", HERE_CASE),
    S("003", "System One compatible API", "Any model name is accepted, including the SDK default jev-latest, unless it names a LoRA adapter", HERE_CASE),
    S("003", "System One compatible API", "The response model is always the served model", "test_seed_sentences.py::test_003_system_one_answers_model_usage_and_label_mass"),
    S("003", "System One compatible API", "A noul answer is the probability of yes; a choice the most probable option, a score the mean level, each with probabilities and confidence, a score echoes its levels in legend", "test_seed_sentences.py::test_003_system_one_answers_model_usage_and_label_mass"),
    S("003", "System One compatible API", "confidence follows the formulas TypeSafe publishes; it can read 0 for a score split between distant levels", "router/src/profile.rs::confidence_per_profile"),
    S("003", "System One compatible API", "Each answer also carries x_label_mass", "test_seed_sentences.py::test_003_system_one_answers_model_usage_and_label_mass"),
    S("003", "System One compatible API", "A choice takes 1 to 255 options and a score 1 to 10 levels", HERE_CASE),
    S("003", "System One compatible API", "Option names that are blank, contain control or line break characters, or repeat another name are refused", HERE_CASE),
    S("003", "System One compatible API", "blank or null levels are refused", HERE_CASE),
    S("003", "System One compatible API", "Beyond 26 options, every option gets a two-letter label checked to be one token; without them a choice is limited to 26", HERE_CASE),
    S("003", "System One compatible API", "instructions are optional: a choice or score without them drops its question line", HERE_CASE),
    S("003", "System One compatible API", "a noul question is answered from its true and false descriptions", HERE_CASE),
    S("003", "System One compatible API", "A noul question with neither, such as the SDK's bare Noul(), is refused", HERE_CASE),
    S("003", "System One compatible API", "Unknown top-level fields are ignored", HERE_CASE),
    S("003", "System One compatible API", "Unknown keys inside a question or inside noul criteria are refused", HERE_CASE),
    S("003", "System One compatible API", "the /v1/decisions fields temperature, prompt_format_version and return_prompt_token_ids with any value other than null are refused", HERE_CASE),
    S("003", "System One compatible API", "chat_template_kwargs is accepted as an SGLang extension", HERE_CASE),
    S("003", "System One compatible API", "an empty state and empty or blank question ids are accepted", HERE_CASE),
    S("003", "System One compatible API", "Invalid requests return 422 with the location of the error, other refusals return 400", HERE_CASE),
    S("003", "System One compatible API", "usage.input_tokens counts the prompt of every question, and usage.output_tokens is 0", "test_seed_sentences.py::test_003_system_one_answers_model_usage_and_label_mass"),
    S("003", "System One compatible API", "GET /v1/models keeps its OpenAI format", HERE_CASE),
    S("003", "System One compatible API", "The SDKs' models.list() and response request_id are not supported", "untested: deliberate difference: both work here in every profile (GET /v1/models also lists TypeSafe's `models`; x-typesafe-request-id is sent, test_sdk.py)"),
    S("003", "System One compatible API", "The SDKs time out after 10 seconds and retry; a request whose client gives up still finishes its encoding", "untested: client behaviour; here a gone client's reads are dropped instead (test_disconnect.py), a deliberate difference"),
    S("003", "Build decisions without /v1/decisions", "/v1/score takes token ids and one label list per item", "test_decisions.py::test_a_decision_replays_through_v1_score"),
    S("003", "Build decisions without /v1/decisions", "Structured output gives the same decision through generation", "untested: this server does not generate (no structured-output route)"),
    S("003", "Limitations", "For yes_no, label_mass counts only the lowercase yes and no tokens", "test_seed_sentences.py::test_003_the_example_request_answers_every_type"),
    S("003", "Limitations", "Reasoning that shows neither tag is not detected; templates with tags that never close a block are refused", "untested: needs such templates; the detection rule is unit-tested (router/src/prompt/chat.rs::reasoning_block_detection)"),
    S("003", "Limitations", "A default temperature in --preferred-sampling-params can reach scoring requests", "untested: no such flag here; a decision's temperature is only its own"),
    S("003", "Limitations", "The server tokenizes each question's full prompt once on the HTTP event loop", "untested: an implementation note of SGLang's; ours tokenizes off the async workers"),
    S("003", "Limitations", "A decision takes a single input, not a chat history; pass the history as the input text or as a JSON array", "test_seed_sentences.py::test_003_object_and_array_inputs_render_as_compact_json"),
]

# ---- request builders ----
YES_NO = {"id": "u", "type": "yes_no", "question": "Urgent?"}
CHOICE = {"id": "c", "type": "choice", "question": "Which team?", "options": [{"name": "billing"}, {"name": "tech"}]}
NOUL = {"type": "noul", "instructions": "Urgent?"}
PREDICATE = {"type": "predicate", "instructions": "Urgent?"}


def sg(*questions: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"input": "The invoice is wrong.", "questions": list(questions) or [YES_NO], **fields}


def choice(**changes: Any) -> dict[str, Any]:
    return sg({**CHOICE, **changes})


def s1(questions: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    return {"state": "The invoice is wrong.", "questions": questions or {"q": NOUL}, **fields}


def oa(*questions: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "The package arrived with a broken screen.", "questions": list(questions) or [PREDICATE], **fields}


def options(n: int) -> dict[str, None]:
    return {f"o{i}": None for i in range(n)}


class Check(NamedTuple):
    sentence: str  # a SENTENCES key: "{seed} {section}: {text}"
    variant: str
    profile: str
    route: str
    body: dict[str, Any]
    status: int
    words: str  # the response body must contain them

    @property
    def id(self) -> str:
        return f"{self.sentence} ({self.variant})" if self.variant else self.sentence


def k(seed: str, section: str, text: str) -> str:
    return f"{seed} {section}: {text}"


E = "/v1/decisions"
O = "/v1/systemone"
CHECKS: list[Check] = [
    # seed 003, /v1/decisions "Errors" (under --compat sglang)
    Check(k("003", "Errors", "an unknown field anywhere in the request"), "top level", "sglang", E, sg(extra=1), 400, '"param":"extra"'),
    Check(k("003", "Errors", "an unknown field anywhere in the request"), "question", "sglang", E, sg({**YES_NO, "extra": 1}), 400, "questions.0.extra"),
    Check(k("003", "Errors", "an unknown field anywhere in the request"), "option", "sglang", E,
          choice(options=[{"name": "a", "colour": 1}, {"name": "b"}]), 400, "questions.0.options.0.colour"),
    Check(k("003", "Errors", "an unknown question type"), "", "sglang", E, sg({**YES_NO, "type": "ranking"}), 400, "questions.0.type"),
    Check(k("003", "Errors", "option or level counts outside the ranges above"), "27 options", "sglang", E,
          choice(options=[{"name": f"o{i}"} for i in range(27)]), 400, "2 to 26 options"),
    Check(k("003", "Errors", "option or level counts outside the ranges above"), "1 option", "sglang", E, choice(options=[{"name": "a"}]), 400, "2 to 26 options"),
    Check(k("003", "Errors", "option or level counts outside the ranges above"), "1 level", "sglang", E,
          sg({"id": "s", "type": "score", "question": "q", "levels": ["a"]}), 400, "2 to 10 levels"),
    Check(k("003", "Errors", "option or level counts outside the ranges above"), "11 levels", "sglang", E,
          sg({"id": "s", "type": "score", "question": "q", "levels": [str(i) for i in range(11)]}), 400, "2 to 10 levels"),
    Check(k("003", "Errors", "a blank input"), "", "sglang", E, {**sg(), "input": "  "}, 400, '"param":"input"'),
    Check(k("003", "Errors", "a blank question"), "", "sglang", E, sg({**YES_NO, "question": " "}), 400, "question 'u': question must not be blank"),
    Check(k("003", "Errors", "a blank question id"), "", "sglang", E, sg({**YES_NO, "id": " "}), 400, "questions[0]: id must be a non-blank string"),
    Check(k("003", "Errors", "a blank level"), "", "sglang", E,
          sg({"id": "s", "type": "score", "question": "q", "levels": ["a", " "]}), 400, "level 1 must not be blank"),
    Check(k("003", "Errors", "a repeated question id"), "", "sglang", E, sg(YES_NO, YES_NO), 400, "duplicate question id 'u'"),
    Check(k("003", "Errors", "option names that are blank"), "", "sglang", E, choice(options=[{"name": " "}, {"name": "b"}]), 400, "the name is blank"),
    Check(k("003", "Errors", "option names that contain control or line break characters"), "line break", "sglang", E,
          choice(options=[{"name": "a\nb"}, {"name": "b"}]), 400, "control or line-break"),
    Check(k("003", "Errors", "option names that contain control or line break characters"), "U+2028", "sglang", E,
          choice(options=[{"name": "a\u2028b"}, {"name": "b"}]), 400, "control or line-break"),
    Check(k("003", "Errors", "option names that repeat another name after trimming and case folding"), "", "sglang", E,
          choice(options=[{"name": "Billing"}, {"name": " billing "}]), 400, "repeats"),
    Check(k("003", "Errors", "option names that repeat another name after trimming and case folding"), "full case folding: Straße, STRASSE", "sglang", E,
          choice(options=[{"name": "Straße"}, {"name": "STRASSE"}]), 400, "repeats"),
    Check(k("003", "Errors", "a label that is not one distinct token at the answer position for the served tokenizer"),
          "30 options on /v1/systemone: two-letter labels", "sglang", O, s1({"q": {"type": "choice", "instructions": "i", "criteria": options(30)}}), 400,
          "single token"),
    Check(k("003", "Errors", "a prompt that does not fit the model's context length"), "", "sglang", E, {**sg(), "input": "word " * 6000}, 400,
          "max_position_embeddings"),
    Check(k("003", "Errors", "chat_template_kwargs that set the thinking toggle to anything but false"), "true", "sglang", E,
          sg(chat_template_kwargs={"enable_thinking": True}), 400, "thinking must be off"),
    Check(k("003", "Errors", "chat_template_kwargs that set the thinking toggle to anything but false"), "a string", "sglang", E,
          sg(chat_template_kwargs={"enable_thinking": "no"}), 400, "thinking must be off"),
    Check(k("003", "Errors", "a prompt_format_version other than the served one"), "", "sglang", E, sg(prompt_format_version=2), 400, "prompt_format_version"),
    Check(k("003", "Errors", "a model that names a LoRA adapter"), "", "sglang", E, sg(model="base:adapter"), 400, '"param":"model"'),
    Check(k("003", "Errors", "Errors about one question name its id or its position in questions"), "", "sglang", E,
          sg(YES_NO, {"id": "b", "type": "score", "question": "q", "levels": ["a"]}), 400, "questions.1.levels"),
    # seed 003, the rest of /v1/decisions
    Check(k("003", "Supported models", "The server checks these per request and returns a 400 that names the reason when one fails"), "thinking on", "sglang", E,
          sg(chat_template_kwargs={"enable_thinking": True}), 400, "chat_template_kwargs"),
    Check(k("003", "Launch", "No extra flag is needed"), "", "sglang", E, sg(), 200, '"object":"decisions"'),
    Check(k("003", "Request fields", "input must not be blank"), "empty object", "sglang", E, {**sg(), "input": {}}, 400, '"param":"input"'),
    Check(k("003", "Request fields", "questions: at least one"), "", "sglang", E, {"input": "x", "questions": [], "temperature": 1}, 400,
          '"object":"error","message":"invalid request: questions: questions must hold at least one question"'),
    Check(k("003", "Request fields", "temperature: number above 0, default 1"), "0", "sglang", E, sg(temperature=0), 400, "temperature"),
    Check(k("003", "Request fields", "temperature: number above 0, default 1"), "-1", "sglang", E, sg(temperature=-1), 400, "temperature"),
    Check(k("003", "Request fields", "temperature: number above 0, default 1"), "0.5", "sglang", E, sg(temperature=0.5), 200, "answers"),
    Check(k("003", "Request fields", "chat_template_kwargs: the thinking toggle stays off"), "false", "sglang", E,
          sg(chat_template_kwargs={"enable_thinking": False}), 200, "answers"),
    Check(k("003", "Request fields", "prompt_format_version pins the prompt wording"), "the served 1", "sglang", E, sg(prompt_format_version=1), 200,
          '"prompt_format_version":1'),
    Check(k("003", "Request fields", "prompt_format_version pins the prompt wording"), "101 under sglang", "sglang", E, sg(prompt_format_version=101), 400,
          "serves version 1"),
    Check(k("003", "Request fields", "the base:adapter form returns 400"), "", "sglang", E, sg(model="base:adapter"), 400, "adapter"),
    Check(k("003", "Question fields", "choice: 2 to 26 objects with a name and an optional description"), "26", "sglang", E,
          choice(options=[{"name": f"o{i}", "description": "d"} for i in range(26)]), 200, "answers"),
    Check(k("003", "Question fields", "choice: 2 to 26 objects with a name and an optional description"), "a string option", "sglang", E,
          choice(options=["a", "b"]), 400, "must be an object with a name"),
    Check(k("003", "Question fields", "score: 2 to 10 level descriptions, lowest first"), "10", "sglang", E,
          sg({"id": "s", "type": "score", "question": "q", "levels": [f"l{i}" for i in range(10)]}), 200, '"9"'),
    Check(k("003", "Thinking models", "/v1/decisions turns thinking off for every question, refuses a request that turns it back on"), "", "sglang", E,
          sg(YES_NO, CHOICE, chat_template_kwargs={"enable_thinking": True}), 400, "thinking must be off"),
    # seed 003, System One compatible API (under --compat sglang)
    Check(k("003", "System One compatible API", "refuses the same prompts (a prompt over the context is a 400)"), "", "sglang", O,
          s1(state="word " * 6000), 400, "max_position_embeddings"),
    Check(k("003", "System One compatible API", "Any model name is accepted, including the SDK default jev-latest, unless it names a LoRA adapter"),
          "jev-latest", "sglang", O, s1(model="jev-latest"), 200, "answers"),
    Check(k("003", "System One compatible API", "Any model name is accepted, including the SDK default jev-latest, unless it names a LoRA adapter"),
          "base:adapter", "sglang", O, s1(model="base:adapter"), 400, "adapter"),
    Check(k("003", "System One compatible API", "the /v1/decisions fields temperature, prompt_format_version and return_prompt_token_ids with any value other than null are refused"),
          "temperature", "sglang", O, s1(temperature=1), 422, "temperature"),
    Check(k("003", "System One compatible API", "the /v1/decisions fields temperature, prompt_format_version and return_prompt_token_ids with any value other than null are refused"),
          "prompt_format_version", "sglang", O, s1(prompt_format_version=1), 422, "prompt_format_version"),
    Check(k("003", "System One compatible API", "the /v1/decisions fields temperature, prompt_format_version and return_prompt_token_ids with any value other than null are refused"),
          "return_prompt_token_ids false", "sglang", O, s1(return_prompt_token_ids=False), 422, "return_prompt_token_ids"),
    Check(k("003", "System One compatible API", "the /v1/decisions fields temperature, prompt_format_version and return_prompt_token_ids with any value other than null are refused"),
          "null is accepted", "sglang", O, s1(temperature=None, prompt_format_version=None, return_prompt_token_ids=None), 200, "answers"),
    Check(k("003", "System One compatible API", "an empty state and empty or blank question ids are accepted"), "", "sglang", O,
          {"state": "", "questions": {"": NOUL, "  ": NOUL}}, 200, "answers"),
    Check(k("003", "System One compatible API", "Unknown top-level fields are ignored"), "", "sglang", O, s1(zzz=1), 200, "answers"),
    Check(k("003", "System One compatible API", "Unknown keys inside a question or inside noul criteria are refused"), "question", "sglang", O,
          s1({"q": {**NOUL, "zz": 1}}), 422, "zz"),
    Check(k("003", "System One compatible API", "Unknown keys inside a question or inside noul criteria are refused"), "noul criteria", "sglang", O,
          s1({"q": {**NOUL, "criteria": {"true": "yes", "maybe": "?"}}}), 422, "maybe"),
    Check(k("003", "System One compatible API", "chat_template_kwargs is accepted as an SGLang extension"), "", "sglang", O,
          s1(chat_template_kwargs={"enable_thinking": False}), 200, "answers"),
    Check(k("003", "System One compatible API", "A noul question with neither, such as the SDK's bare Noul(), is refused"), "", "sglang", O,
          s1({"q": {"type": "noul"}}), 422, "noul"),
    Check(k("003", "System One compatible API", "a noul question is answered from its true and false descriptions"), "", "sglang", O,
          s1({"q": {"type": "noul", "criteria": {"true": "money is moving", "false": None}}}), 200, '"noul":'),
    Check(k("003", "System One compatible API", "instructions are optional: a choice or score without them drops its question line"), "choice", "sglang", O,
          s1({"q": {"type": "choice", "criteria": {"billing": None, "tech": None}}}), 200, '"choice":'),
    Check(k("003", "System One compatible API", "instructions are optional: a choice or score without them drops its question line"), "score", "sglang", O,
          s1({"q": {"type": "score", "criteria": ["low", "high"]}}), 200, '"score":'),
    Check(k("003", "System One compatible API", "Option names that are blank, contain control or line break characters, or repeat another name are refused"), "repeat",
          "sglang", O, s1({"q": {"type": "choice", "instructions": "i", "criteria": {"Billing": None, " billing": None}}}), 422, "billing"),
    Check(k("003", "System One compatible API", "Option names that are blank, contain control or line break characters, or repeat another name are refused"), "blank",
          "sglang", O, s1({"q": {"type": "choice", "instructions": "i", "criteria": {" ": None, "b": None}}}), 422, "blank"),
    Check(k("003", "System One compatible API", "Option names that are blank, contain control or line break characters, or repeat another name are refused"), "control",
          "sglang", O, s1({"q": {"type": "choice", "instructions": "i", "criteria": {"a\u0007": None, "b": None}}}), 422, "control"),
    Check(k("003", "System One compatible API", "blank or null levels are refused"), "blank", "sglang", O,
          s1({"q": {"type": "score", "instructions": "i", "criteria": ["a", " "]}}), 422, "criteria"),
    Check(k("003", "System One compatible API", "blank or null levels are refused"), "null", "sglang", O,
          s1({"q": {"type": "score", "instructions": "i", "criteria": ["a", None]}}), 422, "criteria"),
    Check(k("003", "System One compatible API", "A choice takes 1 to 255 options and a score 1 to 10 levels"), "256 options", "sglang", O,
          s1({"q": {"type": "choice", "instructions": "i", "criteria": options(256)}}), 422, "255"),
    Check(k("003", "System One compatible API", "A choice takes 1 to 255 options and a score 1 to 10 levels"), "1 option", "sglang", O,
          s1({"q": {"type": "choice", "instructions": "i", "criteria": options(1)}}), 200, '"choice":"o0"'),
    Check(k("003", "System One compatible API", "A choice takes 1 to 255 options and a score 1 to 10 levels"), "1 level", "sglang", O,
          s1({"q": {"type": "score", "instructions": "i", "criteria": ["only"]}}), 200, '"score":0'),
    Check(k("003", "System One compatible API", "A choice takes 1 to 255 options and a score 1 to 10 levels"), "11 levels", "sglang", O,
          s1({"q": {"type": "score", "instructions": "i", "criteria": [str(i) for i in range(11)]}}), 422, "10"),
    Check(k("003", "System One compatible API", "Beyond 26 options, every option gets a two-letter label checked to be one token; without them a choice is limited to 26"),
          "30 options: a 400 naming the label", "sglang", O, s1({"q": {"type": "choice", "instructions": "i", "criteria": options(30)}}), 400, "single token"),
    Check(k("003", "System One compatible API", "Invalid requests return 422 with the location of the error, other refusals return 400"), "422 with loc", "sglang", O,
          s1({"q": {"type": "ranking"}}), 422, '"loc":["body","questions","q","type"]'),
    Check(k("003", "System One compatible API", "Invalid requests return 422 with the location of the error, other refusals return 400"),
          "a label refusal is a 400 of type invalid_request", "sglang", O, s1({"q": {"type": "choice", "instructions": "i", "criteria": options(30)}}), 400,
          '"error_type":"invalid_request"'),
    Check(k("003", "System One compatible API", "GET /v1/models keeps its OpenAI format"), "", "sglang", "GET /v1/models", {}, 200, '"object":"list"'),
    # seeds 000/001 (under --compat vllm)
    Check(k("000", "System One endpoint", "The endpoint is available by default on generation models"), "", "vllm", O, s1(), 200, "structured_decision"),
    Check(k("000", "How it works", "Thinking is off unless chat_template_kwargs turns it on"), "off by default", "vllm", O, s1(), 200, "answers"),
    Check(k("000", "How it works", "Thinking is off unless chat_template_kwargs turns it on"), "turned on: refused with the reason", "vllm", O,
          s1(chat_template_kwargs={"enable_thinking": True}), 400, "thinking must be off"),
    Check(k("000", "Question types", "noul criteria is null, or an object with optional true and false descriptions"), "null", "vllm", O,
          s1({"q": {**NOUL, "criteria": None}}), 200, '"noul":'),
    Check(k("000", "Question types", "noul criteria is null, or an object with optional true and false descriptions"), "true only", "vllm", O,
          s1({"q": {**NOUL, "criteria": {"true": "money is moving"}}}), 200, '"noul":'),
    Check(k("000", "Question types", "noul criteria is null, or an object with optional true and false descriptions"), "another key", "vllm", O,
          s1({"q": {**NOUL, "criteria": {"maybe": "x"}}}), 400, "maybe"),
    Check(k("000", "Question types", "noul criteria is null, or an object with optional true and false descriptions"),
          "neither instructions nor descriptions: vLLM reads a bare noul", "vllm", O, s1({"q": {"type": "noul"}}), 200, '"noul":'),
    Check(k("000", "Question types", "noul criteria is null, or an object with optional true and false descriptions"),
          "the default profile refuses a bare noul", "typesafe", O, s1({"q": {"type": "noul"}}), 422, "needs instructions"),
    Check(k("000", "Question types", "A choice has at least one option"), "one", "vllm", O,
          s1({"q": {"type": "choice", "instructions": "i", "criteria": {"only": None}}}), 200, "answers"),
    Check(k("000", "Question types", "A choice has at least one option"), "none", "vllm", O,
          s1({"q": {"type": "choice", "instructions": "i", "criteria": {}}}), 400, "at least one option"),
    Check(k("000", "Question types", "a score at least two levels"), "", "vllm", O,
          s1({"q": {"type": "score", "instructions": "i", "criteria": ["only"]}}), 400, "at least 2 levels"),
    Check(k("000", "Question types", "A question id is a non-empty string"), "empty", "vllm", O, s1({"": NOUL}), 400, "non-empty"),
    Check(k("000", "Question types", "A question id is a non-empty string"), "blank is non-empty", "vllm", O, s1({" ": NOUL}), 200, '" ":'),
    Check(k("000", "Limits", "questions per request 64"), "65", "vllm", O, s1({f"q{i}": NOUL for i in range(65)}), 400, "at most 64 questions"),
    Check(k("000", "Limits", "questions per request 64"), "65 in the SGLang shape of /v1/decisions", "vllm", E,
          sg(*[{**YES_NO, "id": f"u{i}"} for i in range(65)]), 400, "at most 64 questions"),
    Check(k("000", "Limits", "options per choice 26"), "27", "vllm", O,
          s1({"q": {"type": "choice", "instructions": "i", "criteria": options(27)}}), 400, "at most 26 options"),
    Check(k("000", "Limits", "levels per score 10"), "11", "vllm", O,
          s1({"q": {"type": "score", "instructions": "i", "criteria": [str(i) for i in range(11)]}}), 400, "at most 10 levels"),
    Check(k("000", "Request fields", "chat_template_kwargs: passed to the chat template"), "", "vllm", O,
          s1(chat_template_kwargs={"enable_thinking": False}), 200, "answers"),
    Check(k("000", "Request fields", "chat_template_kwargs: passed to the chat template"), "not an object", "vllm", O,
          s1(chat_template_kwargs=["x"]), 400, "chat_template_kwargs"),
    Check(k("000", "Request fields", "cache_salt: optional prefix-cache salt applied to every question"), "", "vllm", O, s1(cache_salt="salt"), 200, "answers"),
    Check(k("000", "Request fields", "cache_salt: optional prefix-cache salt applied to every question"), "not a string", "vllm", O, s1(cache_salt=3), 400,
          "cache_salt"),
    Check(k("000", "Request fields", "images, audio, videos: optional media URLs or data URLs, for models that take them"), "a text model refuses images",
          "vllm", O, s1(images=["data:image/png;base64,AAAA"]), 400, "images"),
    Check(k("000", "Request fields", "images, audio, videos: optional media URLs or data URLs, for models that take them"), "null is no media",
          "vllm", O, s1(images=None, audio=None, videos=None), 200, "answers"),
    Check(k("000", "Request fields", "A question with any field other than type, instructions and criteria is rejected with a 400"), "", "vllm", O,
          s1({"q": {**NOUL, "foo": 1}}), 400, "foo"),
    Check(k("000", "OpenAI Decisions API", "input accepts a string or an array of user messages with string content or input_text parts"), "input_text parts",
          "vllm", E, oa(input=[{"role": "user", "content": [{"type": "input_text", "text": "broken screen"}]}]), 200, "answers"),
    Check(k("000", "OpenAI Decisions API", "input accepts a string or an array of user messages with string content or input_text parts"), "other roles",
          "vllm", E, oa(input=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]), 400, "only user messages"),
    Check(k("000", "OpenAI Decisions API", "This MVP supports 1-64 questions"), "65", "vllm", E, oa(*[PREDICATE] * 65), 400, "at most 64 questions"),
    Check(k("000", "OpenAI Decisions API", "This MVP supports 1-64 questions"), "0", "vllm", E, {**oa(), "questions": []}, 400, "at least one question"),
    Check(k("000", "OpenAI Decisions API", "2-26 choices"), "27", "vllm", E,
          oa({"type": "choice", "instructions": "i", "choices": [{"value": f"c{i}"} for i in range(27)]}), 400, "between 2 and 26"),
    Check(k("000", "OpenAI Decisions API", "2-26 choices"), "1", "vllm", E, oa({"type": "choice", "instructions": "i", "choices": [{"value": "a"}]}), 400,
          "between 2 and 26"),
    Check(k("000", "OpenAI Decisions API", "2-10 score levels"), "11", "vllm", E,
          oa({"type": "score", "instructions": "i", "levels": [{"label": f"l{i}"} for i in range(11)]}), 400, "between 2 and 10"),
    Check(k("000", "OpenAI Decisions API", "2-10 score levels"), "1", "vllm", E, oa({"type": "score", "instructions": "i", "levels": [{"label": "l"}]}), 400,
          "between 2 and 10"),
    Check(k("000", "OpenAI Decisions API", "Upstream permits 200 questions and 255 choices"), "201 questions in the default profile", "typesafe", E,
          oa(*[PREDICATE] * 201), 400, "at most 200 questions"),
    Check(k("000", "OpenAI Decisions API", "Upstream permits 200 questions and 255 choices"), "256 choices in the default profile", "typesafe", E,
          oa({"type": "choice", "instructions": "i", "choices": [{"value": f"c{i}"} for i in range(256)]}), 400, "between 2 and 255"),
    Check(k("000", "OpenAI Decisions API", "The optional safety_identifier is caller metadata"), "", "vllm", E, oa(safety_identifier="user-1"), 200, "answers"),
    Check(k("000", "OpenAI Decisions API", "The optional safety_identifier is caller metadata"), "not a string", "vllm", E, oa(safety_identifier=1), 400,
          "safety_identifier"),
    Check(k("000", "Implementation and limits", "Thinking is disabled for these reads"), "turning it on is refused", "vllm", E,
          oa(chat_template_kwargs={"enable_thinking": True}), 400, "thinking must be off"),
    Check(k("000", "Implementation and limits", "Image inputs are outside this MVP"), "", "vllm", E,
          oa(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]), 400, "text-only"),
    Check(k("000", "Implementation and limits", "other message roles are outside this MVP"), "assistant", "vllm", E,
          oa(input=[{"role": "assistant", "content": "a"}]), 400, "only user messages"),
    Check(k("000", "Implementation and limits", "tools, streaming are outside this MVP"), "tools", "vllm", E, oa(tools=[]), 400, "tools"),
    Check(k("000", "Implementation and limits", "tools, streaming are outside this MVP"), "stream", "vllm", E, oa(stream=True), 400, "stream"),
    Check(k("000", "Implementation and limits", "Unsupported request fields and input types are rejected"), "a field", "vllm", E, oa(temperature_x=1), 400,
          "Unrecognized request argument"),
    Check(k("000", "Implementation and limits", "Unsupported request fields and input types are rejected"), "an input item type", "vllm", E,
          oa(input=[{"type": "function_call_output", "output": "x"}]), 400, "not supported"),
    Check(k("000", "Implementation and limits", "The /v1/systemone endpoint retains its existing request format and is available by default"), "", "vllm", O,
          s1(), 200, '"q":'),
]


# ---- the servers ----
@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from conftest import HEALTH_TIMEOUT_S
    from launchers import Launcher, cache_dir, start_launcher

    model = cache_dir() / "models" / "tiny-qwen3"
    assert (model / "config.json").is_file(), f"{model} is missing: run `make fixtures`"
    launchers: dict[str, Launcher] = {}
    try:
        for compat in ("sglang", "vllm", "typesafe"):
            workdir: Path = tmp_path_factory.mktemp(compat)
            launchers[compat] = start_launcher(
                workdir, ["--model-id", str(model), "--compat", compat, "--dtype", "float32", "--hostname", "127.0.0.1"],
                name=f"seed_{compat}",
            )
        for launcher in launchers.values():
            launcher.wait_healthy(HEALTH_TIMEOUT_S)
        yield {compat: launcher.url for compat, launcher in launchers.items()}
    finally:
        for launcher in launchers.values():
            launcher.stop(grace_s=20.0)


def post(servers: dict[str, str], profile: str, route: str, body: dict[str, Any]) -> httpx2.Response:
    r = httpx2.post(servers[profile] + route, json=body, timeout=120)
    return r


def ok(servers: dict[str, str], profile: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
    r = post(servers, profile, route, body)
    assert r.status_code == 200, r.text[:600]
    payload: dict[str, Any] = r.json()
    return payload


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.id)
def test_seed_sentence(servers: dict[str, str], check: Check) -> None:
    if check.route.startswith("GET "):
        r = httpx2.get(servers[check.profile] + check.route[4:], timeout=60)
    else:
        r = post(servers, check.profile, check.route, check.body)
    assert r.status_code == check.status and check.words in r.text, (r.status_code, r.text[:600])


# ---- seed 000 (vLLM) ----
SEED_000_EXAMPLE: dict[str, Any] = {
    "model": "Qwen/Qwen3-0.6B",
    "state": {"ticket": "My card was charged twice for one order."},
    "questions": {
        "team": {"type": "choice", "instructions": "Which team should handle this ticket?",
                 "criteria": {"billing": "payments and refunds", "shipping": "deliveries", "security": "account access"}},
        "urgent": {"type": "noul", "instructions": "Does the customer need a reply within the hour?",
                   "criteria": {"true": "the account is locked or money is moving"}},
        "tone": {"type": "score", "instructions": "How upset is the customer?", "criteria": ["calm", "annoyed", "furious"]},
    },
    "chat_template_kwargs": {"enable_thinking": False},
}


def test_000_the_example_request_answers_as_the_example_response(servers: dict[str, str]) -> None:
    """Seed 000's curl example under --compat vllm: every key of its response, the answer of each type, confidence as
    the chosen share times label_mass, answers in request order."""
    body = ok(servers, "vllm", "/v1/systemone", SEED_000_EXAMPLE)
    assert body["id"].startswith("decision-") and body["object"] == "structured_decision" and isinstance(body["created"], int)
    assert set(body) == {"id", "object", "created", "model", "answers", "usage", "diagnostics"}, set(body)
    assert list(body["answers"]) == ["team", "urgent", "tone"] and list(body["diagnostics"]) == ["team", "urgent", "tone"]
    team, urgent, tone = (body["answers"][q] for q in ("team", "urgent", "tone"))
    assert team["type"] == "choice" and list(team["probabilities"]) == ["billing", "shipping", "security"]
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert urgent["type"] == "noul" and list(urgent["probabilities"]) == ["yes", "no"] and urgent["noul"] == urgent["probabilities"]["yes"]
    assert tone["type"] == "score" and tone["legend"] == {"0": "calm", "1": "annoyed", "2": "furious"}
    assert list(tone["probabilities"]) == ["0", "1", "2"]
    assert math.isclose(tone["score"], sum(int(i) * p for i, p in tone["probabilities"].items()), abs_tol=1e-9)
    for qid, answer in body["answers"].items():
        p = answer["probabilities"]
        assert math.isclose(sum(p.values()), 1.0, abs_tol=1e-9) and all(0 <= v <= 1 for v in p.values())
        diagnostics = body["diagnostics"][qid]
        assert set(diagnostics) == {"label_mass", "argmax_is_label"} and 0 < diagnostics["label_mass"] <= 1
        assert math.isclose(answer["confidence"], max(p.values()) * diagnostics["label_mass"], rel_tol=1e-9), (qid, answer)
    # One read per question, one output token each (vLLM's usage).
    assert body["usage"]["output_tokens"] == 3 and body["usage"]["input_tokens"] > 0


SEED_000_OPENAI: dict[str, Any] = {
    "model": "Qwen/Qwen3-0.6B",
    "input": "The package arrived with a broken screen.",
    "questions": [
        {"type": "predicate", "name": "damaged", "instructions": "Does the customer report a damaged item?"},
        {"type": "choice", "name": "department", "instructions": "Which department should handle this complaint?",
         "choices": [{"value": "returns"}, {"value": "billing"}]},
        {"type": "score", "instructions": "How severe is the damage?", "levels": [{"label": "cosmetic"}, {"label": "broken"}]},
    ],
}


def test_000_the_openai_example_answers_in_question_order(servers: dict[str, str]) -> None:
    """Seed 000's `client.decisions.create` example under --compat vllm: answers in question order with `name` echoed
    (null when unnamed), normalized probabilities, the score as Σ i·p_i, confidence the winner's share times the label
    mass, and usage with prompt, output and prefix-cache counters."""
    body = ok(servers, "vllm", "/v1/decisions", SEED_000_OPENAI)
    answers = body["answers"]
    assert [a["type"] for a in answers] == ["predicate", "choice", "score"]
    assert [a["name"] for a in answers] == ["damaged", "department", None]
    assert 0 <= answers[0]["probability"] <= 1
    for answer in answers[1:]:
        ps = [p["probability"] for p in answer["probabilities"]]
        assert math.isclose(sum(ps), 1.0, abs_tol=1e-9)
        assert 0 < answer["confidence"] <= max(ps) + 1e-12
    assert [p["value"] for p in answers[1]["probabilities"]] == ["returns", "billing"]
    score = answers[2]
    assert math.isclose(score["score"], sum(p["value"] * p["probability"] for p in score["probabilities"]), abs_tol=1e-9)
    usage = body["usage"]
    assert usage["output_tokens"] == 3 and usage["input_tokens"] > 0
    assert "cached_tokens" in usage["input_tokens_details"] and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_000_openai_choice_values_preserve_strings_and_booleans(servers: dict[str, str]) -> None:
    body = ok(servers, "vllm", "/v1/decisions", oa({"type": "choice", "instructions": "Refund?", "choices": [{"value": True}, {"value": "true"}]}))
    values = [p["value"] for p in body["answers"][0]["probabilities"]]
    assert values == [True, "true"] and type(values[0]) is bool and isinstance(body["answers"][0]["choice"], (bool, str))


# ---- seed 003 (SGLang) ----
SEED_003_EXAMPLE: dict[str, Any] = {
    "input": "I've been trying to connect my Stripe account for 3 days and the integration keeps failing. I'm losing sales.",
    "questions": [
        {"id": "team", "type": "choice", "question": "Which team should handle this ticket?", "options": [
            {"name": "billing", "description": "Payment or subscription issues"},
            {"name": "technical", "description": "Bugs or integration problems"},
            {"name": "sales", "description": "Pricing or account questions"}]},
        {"id": "frustration", "type": "score", "question": "How frustrated is the customer?", "levels": ["Calm", "Frustrated but civil", "Very angry"]},
        {"id": "urgent", "type": "yes_no", "question": "The customer needs an answer today."},
    ],
}


def test_003_the_example_request_answers_every_type(servers: dict[str, str]) -> None:
    """Seed 003's example request, with `return_prompt_token_ids`: the response keys, each answer's fields, usage as
    the sum of the questions' prompts, and a yes/no label set of exactly the two lowercase tokens."""
    body = ok(servers, "sglang", "/v1/decisions", {**SEED_003_EXAMPLE, "return_prompt_token_ids": True})
    assert body["object"] == "decisions" and body["model"] == "default" and body["prompt_format_version"] == 1
    assert list(body["answers"]) == ["team", "frustration", "urgent"]
    team, frustration, urgent = (body["answers"][q] for q in ("team", "frustration", "urgent"))
    for answer, kind in ((team, "choice"), (frustration, "score"), (urgent, "yes_no")):
        assert answer["type"] == kind and math.isclose(sum(answer["probabilities"].values()), 1.0, abs_tol=1e-9)
        assert 0 < answer["label_mass"] <= 1
        assert answer["prompt_token_ids"] and len(answer["label_token_ids"]) == len(answer["probabilities"])
    assert list(team["probabilities"]) == ["billing", "technical", "sales"]
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert list(frustration["probabilities"]) == ["0", "1", "2"]
    assert math.isclose(frustration["score"], sum(int(i) * p for i, p in frustration["probabilities"].items()), abs_tol=1e-9)
    assert list(urgent["probabilities"]) == ["yes", "no"] and "choice" not in urgent and "score" not in urgent
    # Limitations: "label_mass counts only the lowercase yes and no tokens": one token id each, no variants.
    assert all(isinstance(label, int) for label in urgent["label_token_ids"]), urgent["label_token_ids"]
    prompts = sum(len(a["prompt_token_ids"]) for a in body["answers"].values())
    assert body["usage"]["prompt_tokens"] == prompts and body["usage"]["completion_tokens"] == 0


def test_003_temperature_divides_the_label_logits_and_not_label_mass(servers: dict[str, str]) -> None:
    """p_yes = exp(lp_yes/T) / Σ exp(lp/T): the log-odds at T are the log-odds at 1 divided by T; label_mass is the same
    at every T. The same holds over a choice's labels."""
    questions = [YES_NO, CHOICE]
    at_1 = ok(servers, "sglang", "/v1/decisions", sg(*questions))["answers"]
    at_half = ok(servers, "sglang", "/v1/decisions", sg(*questions, temperature=0.5))["answers"]
    for qid in ("u", "c"):
        p1, ph = list(at_1[qid]["probabilities"].values()), list(at_half[qid]["probabilities"].values())
        assert math.isclose(math.log(ph[0] / ph[1]), 2 * math.log(p1[0] / p1[1]), rel_tol=1e-4, abs_tol=1e-6), (qid, p1, ph)
        assert math.isclose(at_1[qid]["label_mass"], at_half[qid]["label_mass"], rel_tol=1e-5)  # prefix cache: float32
    explicit = ok(servers, "sglang", "/v1/decisions", sg(*questions, temperature=1))["answers"]
    assert all(math.isclose(a, b, abs_tol=1e-9) for a, b in zip(explicit["u"]["probabilities"].values(), at_1["u"]["probabilities"].values()))


def test_003_questions_are_answered_independently(servers: dict[str, str]) -> None:
    together = ok(servers, "sglang", "/v1/decisions", sg(YES_NO, CHOICE))["answers"]
    for question in (YES_NO, CHOICE):
        alone = ok(servers, "sglang", "/v1/decisions", sg(question))["answers"][question["id"]]
        for a, b in zip(alone["probabilities"].values(), together[question["id"]]["probabilities"].values()):
            assert math.isclose(a, b, abs_tol=1e-5), (question["id"], alone, together)


def test_003_object_and_array_inputs_render_as_compact_json(servers: dict[str, str]) -> None:
    """An object or array input reads as its compact JSON text; a conversation history passed as a JSON array is one input."""
    for value in ({"ticket": "late", "days": [1, 2]}, [{"role": "user", "content": "hi"}, {"role": "agent", "content": "hello"}]):
        as_json = ok(servers, "sglang", "/v1/decisions", {**sg(), "input": value, "return_prompt_token_ids": True})["answers"]["u"]
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        as_text = ok(servers, "sglang", "/v1/decisions", {**sg(), "input": text, "return_prompt_token_ids": True})["answers"]["u"]
        assert as_json["prompt_token_ids"] == as_text["prompt_token_ids"]


def test_003_yes_and_no_descriptions_are_read(servers: dict[str, str]) -> None:
    plain = ok(servers, "sglang", "/v1/decisions", sg(YES_NO, return_prompt_token_ids=True))["answers"]["u"]
    described = ok(servers, "sglang", "/v1/decisions", sg({**YES_NO, "yes": "money is moving", "no": "it can wait"}, return_prompt_token_ids=True))["answers"]["u"]
    assert len(described["prompt_token_ids"]) > len(plain["prompt_token_ids"])


def think_tokens() -> tuple[int, int]:
    from launchers import cache_dir

    tokenizer = json.loads((cache_dir() / "models" / "tiny-qwen3" / "tokenizer.json").read_text())
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    return ids["<think>"], ids["</think>"]


def test_003_thinking_stays_off_the_prompt_closes_the_think_block(servers: dict[str, str]) -> None:
    """Every question's prompt holds a closed think block before the answer position (Qwen3's template with thinking
    off), so the answer is never read inside the reasoning."""
    open_id, close_id = think_tokens()
    answers = ok(servers, "sglang", "/v1/decisions", sg(YES_NO, CHOICE, return_prompt_token_ids=True))["answers"]
    for answer in answers.values():
        ids = answer["prompt_token_ids"]
        assert open_id in ids and close_id in ids and ids.index(open_id) < len(ids) - 1 - ids[::-1].index(close_id)
        assert ids.count(open_id) == ids.count(close_id)


def test_003_system_one_answers_model_usage_and_label_mass(servers: dict[str, str]) -> None:
    """/v1/systemone under --compat sglang: the served model's name whatever was sent, a noul answer the probability of
    yes, choice and score with probabilities and confidence, a score's legend, x_label_mass on each answer, and usage
    the prompts of every question (the same count /v1/decisions reports for the same questions) with 0 output tokens."""
    state = "The invoice is wrong."
    body = ok(servers, "sglang", "/v1/systemone", {"model": "jev-latest", "state": state, "questions": {
        "u": NOUL, "c": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": None, "tech": None}},
        "s": {"type": "score", "instructions": "How upset?", "criteria": ["calm", {"label": "annoyed"}]}}})
    assert body["model"] == "tiny-qwen3" and body["model"] != "jev-latest"
    u, c, s = (body["answers"][q] for q in ("u", "c", "s"))
    assert u["type"] == "noul" and 0 <= u["noul"] <= 1
    assert c["choice"] in ("billing", "tech") and "confidence" in c and set(c["probabilities"]) == {"billing", "tech"}
    assert s["legend"] == {"0": "calm", "1": {"label": "annoyed"}} and "confidence" in s and set(s["probabilities"]) == {"0", "1"}
    assert all(0 < a["x_label_mass"] <= 1 for a in body["answers"].values())
    assert body["usage"]["output_tokens"] == 0
    one = ok(servers, "sglang", "/v1/systemone", {"state": state, "questions": {"u": NOUL}})["usage"]["input_tokens"]
    assert body["usage"]["input_tokens"] > 2 * one  # the state is counted once per question
    decisions = ok(servers, "sglang", "/v1/decisions", {"input": state, "questions": [{"id": "u", "type": "yes_no", "question": "Urgent?"}]})
    assert one == decisions["usage"]["prompt_tokens"]


def test_003_model_is_echoed_as_default_when_omitted(servers: dict[str, str]) -> None:
    url = servers["sglang"] + "/v1/decisions"
    assert httpx2.post(url, json=sg(), timeout=60).json()["model"] == "default"
    assert httpx2.post(url, json=sg(model="my-model"), timeout=60).json()["model"] == "my-model"


def test_003_score_probabilities_are_keyed_by_level_index(servers: dict[str, str]) -> None:
    """Two equal level texts stay two levels."""
    r = httpx2.post(servers["sglang"] + "/v1/decisions", json=sg({"id": "s", "type": "score", "question": "q", "levels": ["same", "same", "other"]}), timeout=60)
    assert r.status_code == 200, r.text
    p = r.json()["answers"]["s"]["probabilities"]
    assert list(p) == ["0", "1", "2"] and abs(sum(p.values()) - 1) < 1e-9


def test_003_question_descriptions_and_levels_may_be_json(servers: dict[str, str]) -> None:
    """Rendered as compact JSON: the same answer as sending that text."""
    url = servers["sglang"] + "/v1/decisions"
    as_json = sg({"id": "u", "type": "yes_no", "question": {"ask": "late?", "days": [1, 2]}, "yes": ["refund", 1]},
                 return_prompt_token_ids=True)
    as_text = sg({"id": "u", "type": "yes_no", "question": '{"ask":"late?","days":[1,2]}', "yes": '["refund",1]'},
                 return_prompt_token_ids=True)
    a, b = (httpx2.post(url, json=body, timeout=60).json()["answers"]["u"] for body in (as_json, as_text))
    assert a["prompt_token_ids"] == b["prompt_token_ids"] and a["probabilities"] == b["probabilities"]


# ---- the coverage table (no server needed) ----
def is_tested(sentence: Sentence) -> bool:
    if sentence.where == "=000":
        same = [s for s in SENTENCES if s.seed == "000" and s.section == sentence.section and s.text == sentence.text]
        return bool(same) and is_tested(same[0])
    return not sentence.where.startswith("untested:")


def untested_reason(sentence: Sentence) -> str:
    if sentence.where == "=000":
        return untested_reason(next(s for s in SENTENCES if s.seed == "000" and s.section == sentence.section and s.text == sentence.text))
    return sentence.where.removeprefix("untested:").strip()


def coverage_markdown() -> str:
    """The coverage table of docs/profiles.md, generated from SENTENCES."""
    rows: dict[tuple[str, str], list[Sentence]] = {}
    for sentence in SENTENCES:
        rows.setdefault((sentence.seed, sentence.section), []).append(sentence)
    lines = ["| seed | section | testable sentences | tested | untested, with the reason |", "|---|---|---|---|---|"]
    for (seed, section), sentences in rows.items():
        missing = [s for s in sentences if not is_tested(s)]
        reasons = "<br>".join(f"“{s.text}”: {untested_reason(s)}" for s in missing) or "—"
        lines.append(f"| {seed} | {section} | {len(sentences)} | {len(sentences) - len(missing)} | {reasons} |")
    total = len(SENTENCES)
    done = sum(is_tested(s) for s in SENTENCES)
    lines.append(f"| **all** | | **{total}** | **{done}** | |")
    return "\n".join(lines)


def test_every_sentence_is_tested_or_has_a_reason() -> None:
    keys = [s.key for s in SENTENCES]
    assert len(keys) == len(set(keys)), "a sentence is listed twice"
    case_ids = [c.id for c in CHECKS]
    assert len(case_ids) == len(set(case_ids)), "two cases share an id"
    for check in CHECKS:
        assert check.sentence in keys, f"case {check.id!r} names no listed sentence"
    repo = HERE.parent
    for sentence in SENTENCES:
        where = sentence.where
        if where == HERE_CASE:
            assert any(c.sentence == sentence.key for c in CHECKS), f"no case for {sentence.key!r}"
        elif where == "=000":
            assert any(s.seed == "000" and s.section == sentence.section and s.text == sentence.text for s in SENTENCES), sentence.key
        elif where.startswith("untested:"):
            assert len(where) > len("untested: ") + 10, f"{sentence.key!r}: say why it is untested"
        else:
            path, _, name = where.partition("::")
            file = repo / path if "/" in path else HERE / path
            assert file.is_file(), f"{sentence.key!r}: {file} does not exist"
            pattern = rf"\bdef {re.escape(name)}\(" if file.suffix == ".py" else rf"\bfn {re.escape(name)}\("
            assert re.search(pattern, file.read_text()), f"{sentence.key!r}: no test {name} in {path}"


def test_the_coverage_table_in_docs_matches_the_sentence_list() -> None:
    text = DOC.read_text()
    begin, end = "<!-- coverage:begin -->\n", "\n<!-- coverage:end -->"
    assert begin in text and end in text, f"{DOC} has no generated coverage table"
    table = text.split(begin, 1)[1].split(end, 1)[0]
    assert table == coverage_markdown(), "docs/profiles.md's coverage table is stale: run `python integration-tests/test_seed_sentences.py --write`"


if __name__ == "__main__":
    generated = coverage_markdown()
    if "--write" in sys.argv:
        text = DOC.read_text()
        head, rest = text.split("<!-- coverage:begin -->\n", 1)
        _, tail = rest.split("\n<!-- coverage:end -->", 1)
        DOC.write_text(f"{head}<!-- coverage:begin -->\n{generated}\n<!-- coverage:end -->{tail}")
    else:
        print(generated)
