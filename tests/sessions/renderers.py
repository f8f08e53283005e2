"""Model directories for the local renderer, built on the spot: a small byte-level
BPE ``tokenizer.json`` plus a chat template (the tiny vLLM test model's, or
Qwen3's shipped in ``data/``)."""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).parent / "data"
QWEN3_TEMPLATE = (DATA / "qwen3_chat_template.jinja").read_text()
# The tiny vLLM test model's template (tests/real_engine/tiny_model.py).
TINY_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_ADDED = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
]
_TEXT = [
    "You fix failing tests. The user asks; the assistant answers and calls tools.",
    "Let me think about the plan first, then run the tests again.",
    '{"name": "run_tests", "arguments": {"path": "tests/test_x.py"}}',
    "system user assistant tool function parameters type object string",
]


def model_dir(root: Path, template: str, eos: str = "<|im_end|>") -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (with ``template``) under ``root``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=_SPECIAL, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(_TEXT * 4, trainer)
    tok.add_tokens([AddedToken(t, normalized=False) for t in _ADDED])
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    config = {"chat_template": template, "eos_token": eos, "bos_token": None}
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root
