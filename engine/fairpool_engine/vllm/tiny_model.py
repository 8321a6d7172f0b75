"""A tiny random-weight Llama and its tokenizer, built locally (nothing downloaded).

For tests and demos of real vLLM on CPU: a byte-level BPE tokenizer (vocabulary 1,024)
trained on Python's own standard-library sources, and a 2-layer Llama with hidden size
128 and 4 heads (head size 32, the smallest vLLM's CPU attention supports), float32,
random weights — about 0.56 M parameters, 2 MB. Its output is gibberish; its token
counts, prefix caching, batching and preemption behave like any model's.

    python -m fairpool_engine.vllm.tiny_model OUT_DIR
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>"
    "{{ message['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def training_text(files: int = 200) -> list[str]:
    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:files]
    return [source.read_text(errors="ignore") for source in sources]


def build_tokenizer(out: Path, vocab_size: int = 1024) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(training_text(), trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(out)


def build_model(out: Path, vocab_size: int = 1024, max_positions: int = 2048) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(out)


def build(out: str | Path) -> Path:
    """Build the model and tokenizer into `out` (skipped if already there)."""
    target = Path(out)
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.mkdir(parents=True, exist_ok=True)
    build_tokenizer(target)
    build_model(target)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="directory to write the model and tokenizer to")
    print(build(parser.parse_args().out))


if __name__ == "__main__":
    main()
