"""A tiny Llama, its tokenizer and LoRA adapters, made on the spot (no download).

vLLM's CPU attention supports head sizes 32, 64, 80, 96, 112, 128, ... only, so
the model is hidden 128 with 4 heads (head size 32), 2 layers, vocabulary 512,
float32. The tokenizer is a byte-level BPE trained on a few sentences (filled
up to 512 ids), with ``<s>`` (id 0) prepended and a chat template. Adapters
are peft ``LoraConfig(r=4, q_proj/v_proj, init_lora_weights=False)`` so their
outputs differ from the base model. Everything is seeded: the same files every run.

Layout under ``root``::

    tiny/                      the model (--model root/tiny)
    loras/a1 a2 a3             adapters loaded through /v1/load_lora_adapter
    resolver/res1 res2         adapters vLLM's filesystem resolver finds by name
    resolver/run2_step1        the same, named as the gateway names tinker://run2/sampler_weights/step1
    resolver/broken            adapter_config.json with corrupt weights
    resolver/notanadapter      a directory without an adapter
    resolver/badbase           an adapter for another base model
    not_an_adapter/            a directory without an adapter
    corrupt/                   adapter_config.json with corrupt weights
    tinker/run1/step1 ...      adapters named by tinker://run1/sampler_weights/stepN
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

VOCAB = 512
SENTENCES = [
    "Hello, how are you? I am fine, thank you.",
    "The quick brown fox jumps over the lazy dog.",
    "A gateway forwards sampling requests to engines without becoming the bottleneck.",
    "Reinforcement learning trainers send thousands of generation requests at once.",
    "The assistant answers the user; the system sets the rules.",
    "LoRA adapters appear lazily and weight updates pause everything.",
    "OpenAI and Tinker clients talk to the same fleet of vLLM engines.",
    "Queue time is free; a busy engine is not a failure.",
    "Tokens, logprobs and prompt logprobs come back for every sample.",
    "Trio nurseries, cancel scopes and capacity limiters keep every request accounted for.",
    "One, two, three, four, five, six, seven, eight, nine, ten.",
    "Monday Tuesday Wednesday Thursday Friday Saturday Sunday",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SENTENCES * 4, trainer)
    filler = VOCAB - tok.get_vocab_size()
    if filler > 0:  # the sentences gave fewer merges: every id below VOCAB is a token
        tok.add_tokens([f"<extra_{i}>" for i in range(filler)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 0)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def _adapter(base_model: object, out: Path, seed: int, base_name: str) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    peft_model = get_peft_model(base_model, config)  # type: ignore[arg-type]
    peft_model.save_pretrained(str(out))
    peft_model.unload()  # restores the base modules for the next adapter
    cfg_path = out / "adapter_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["base_model_name_or_path"] = base_name  # vLLM's resolver wants the --model value
    cfg_path.write_text(json.dumps(cfg, indent=2))


def build(root: Path) -> Path:
    """Write the model and adapters under ``root``; returns the model directory."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = root / "tiny"
    _tokenizer(model_dir)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(model_dir, safe_serialization=True)
    base = str(model_dir)
    adapters = {
        "loras/a1": 1,
        "loras/a2": 2,
        "loras/a3": 3,
        "resolver/res1": 4,
        "resolver/res2": 5,
        "resolver/run2_step1": 11,  # tinker://run2/sampler_weights/step1, found by the resolver
        "tinker/run1/step1": 6,
        "tinker/run1/step2": 7,
        "tinker/run1/step3": 8,
        "tinker/run1/step4": 9,
    }
    for path, seed in adapters.items():
        _adapter(model, root / path, seed, base)
    _adapter(model, root / "resolver/badbase", 10, "some/other-model")
    for broken in ("resolver/broken", "corrupt"):
        shutil.copytree(root / "loras/a1", root / broken)
        (root / broken / "adapter_model.safetensors").write_bytes(b"\xff" * 64)
    for empty in ("resolver/notanadapter", "not_an_adapter"):
        (root / empty).mkdir(parents=True)
        (root / empty / "README").write_text("not an adapter\n")
    return model_dir


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1])))
