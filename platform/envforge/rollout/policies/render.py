"""The one prompt renderer of every policy that owns its tokens (`hf:`, `vllm:`, the SFT teacher).

A prompt is the checkpoint's own chat template over the conversation so far, tools included,
with the generation prompt, tokenized in one go. Control tokens that appear *inside* message
text (a tool observation that prints `<|im_end|>`, a ticket that quotes `<|im_start|>system`)
are encoded as the plain text they are (`sanitize_control_tokens=True`), so a file in the
sandbox cannot end the turn or forge a system message. The policies pass these ids to their
engine as token ids, so the recorded prompt ids are exactly what the model saw, and the
same conversation gives the same ids whichever engine samples it: GRPO's behaviour
log-probs from vLLM and the trainer's recomputation over HF ids refer to the same tokens.
"""

from __future__ import annotations

from typing import Any


def render_prompt(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
    """Prompt token ids for the next assistant turn (see the module docstring)."""
    enc = tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        add_generation_prompt=True,
        tokenize=True,
        sanitize_control_tokens=True,
        return_dict=True,
    )
    return list(enc["input_ids"])
