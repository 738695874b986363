"""A tiny causal LM and tokenizer built in code, for tests and CPU demos.

Nothing is downloaded: the tokenizer is a byte-level BPE trained deterministically on a
fixed built-in text (so tool JSON and shell commands take few tokens and prompts stay well
under the position limit), and the model is a randomly initialised, seeded Qwen2. The chat
template is ChatML with Hermes-style tool calls, the convention `envforge.rollout.actions`
parses, so the same prompts work unchanged with real Qwen-family checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from envforge.rollout.actions import TOOLS
from envforge.rollout.policies.base import IM_END, IM_START

EOS = "<|endoftext|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END]  # ids 0, 1, 2
VOCAB_SIZE = 1024
# Qwen2's pre-tokenizer split: `AutoTokenizer` maps a `qwen2` checkpoint to `Qwen2Tokenizer`,
# which rebuilds the pipeline (NFC + this split + byte level) around the saved vocab and
# merges, so ours must be identical for ids to survive a save/load round trip.
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# ChatML with tools in the system block and Hermes-style `<tool_call>` text. Tool results are
# a user turn holding `<tool_response>` blocks (consecutive results share one turn).
CHAT_TEMPLATE = r"""
{%- macro text(c) -%}
{%- if c is string -%}{{- c -}}
{%- elif c is iterable and c is not mapping -%}{%- for p in c -%}{%- if p.text is defined -%}{{- p.text -}}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- text(messages[0].content) + '\n\n' -}}{%- endif -%}
{{- '# Tools\n\nYou may call the following tools. Their signatures are listed in <tools></tools>:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' -}}{{- tool | tojson -}}{%- endfor -%}
{{- '\n</tools>\n\nTo act, answer with one JSON object between tags:\n<tool_call>{"name": <tool-name>, "arguments": <args-json-object>}</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + text(messages[0].content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' and loop.first -%}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' + text(message.content) -}}
{%- if message.tool_calls -%}
{%- for tc in message.tool_calls -%}
{%- set fn = tc.function if tc.function is defined else tc -%}
{%- if not loop.first or text(message.content) -%}{{- '\n' -}}{%- endif -%}
{{- '<tool_call>{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- (fn.arguments if fn.arguments is defined else {}) | tojson -}}{%- endif -%}
{{- '}</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + text(message.content) + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- else -%}
{{- '<|im_start|>' + message.role + '\n' + text(message.content) + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
""".strip()


def _training_text() -> list[str]:
    """The fixed corpus the BPE merges are learned from: what rollout prompts are made of."""
    tool_json = [json.dumps(t, ensure_ascii=False) for t in TOOLS]
    calls = [
        '<tool_call>{"name": "run", "arguments": {"command": "python3 -m pytest -q"}}</tool_call>',
        '<tool_call>{"name": "read_file", "arguments": {"path": "src/app/main.py"}}</tool_call>',
        '<tool_call>{"name": "write_file", "arguments": {"path": "README.md", "content": "# Notes\\n"}}</tool_call>',
        '<tool_call>{"name": "apply_patch", "arguments": {"patch": "--- a/x.py\\n+++ b/x.py\\n@@ -1 +1 @@\\n-a\\n+b\\n"}}</tool_call>',
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>',
    ]
    prose = [
        "You are a careful software engineer working in a sandbox. Fix the failing tests in /workspace.",
        "The task: the function returns the wrong value when the input list is empty. Make the tests pass.",
        "exit code 1\n==== FAILURES ====\nFAILED tests/test_app.py::test_empty - AssertionError: assert None == 0",
        "exit code 0\n5 passed in 0.12s\n",
        "ls -la && git status && git diff && cat setup.py && grep -rn 'def ' src/ | head -n 20",
        'def total(values: list[int]) -> int:\n    """Sum of the values."""\n    return sum(values) if values else 0\n',
        "import os\nimport sys\nfrom pathlib import Path\n\nclass Config:\n    def __init__(self, path):\n        self.path = path\n",
        "I will read the file first, then run the tests to see what fails, then write a fix and submit.",
        "<tool_response>\nexit code 0\nok\n</tool_response>",
        "# Tools\n\nYou may call the following tools. Their signatures are listed in <tools></tools>:\n<tools>\n</tools>",
    ]
    return tool_json + calls + prose


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A deterministic byte-level BPE tokenizer with ChatML special tokens and a tool-aware template.

    Byte-level means no unknown tokens (text round-trips up to NFC normalisation); the trained
    merges keep prompts short; the corpus is fixed in code, so ids are the same on every build."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_training_text() * 3, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        pad_token=EOS,
        bos_token=None,
        unk_token=None,
        extra_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=TinyModelConfig.max_position,
        clean_up_tokenization_spaces=False,
    )


@dataclass
class TinyModelConfig:
    hidden_size: int = 64
    num_layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    max_position: int = 2048
    seed: int = 0


def build_tiny_model(cfg: TinyModelConfig | None = None) -> tuple[Qwen2ForCausalLM, PreTrainedTokenizerFast]:
    """A seeded, randomly initialised Qwen2 sized for CPU tests, with its tokenizer.

    Seeding happens in a forked RNG so building a model does not disturb the caller's RNG."""
    cfg = cfg or TinyModelConfig()
    tokenizer = build_tokenizer()
    stop_ids = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.eos_token_id]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        max_position_embeddings=cfg.max_position,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=stop_ids,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id)
    model.eval()
    return model, tokenizer


def save_pretrained_dir(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, path: str | Path) -> Path:
    """Write a Hugging Face checkpoint directory (safetensors, config, generation config,
    tokenizer files, chat template) that `from_pretrained` and `vllm serve` load offline."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
