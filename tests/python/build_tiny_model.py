#!/usr/bin/env python3
"""Build a tiny, random-weight Llama model that real vLLM (CPU) can serve.

Why: the balancer's integration tests need a real inference server, but no
model hub is reachable from the test machines.  This script makes a complete
Hugging Face model directory offline and deterministically:

* a byte-level BPE tokenizer trained with `tokenizers` on text generated here
  from a fixed seed (pseudo-words, numbers, punctuation), saved as a
  `PreTrainedTokenizerFast` with a ChatML-style chat template;
* a 2-layer `LlamaForCausalLM` (hidden 128, 4 heads, vocab 4096, 4096
  positions) with seeded random weights, saved as safetensors.

The output is meant to be identical across runs (same sha256 for
model.safetensors and tokenizer.json).  It produces gibberish: tests should
control output length with `max_tokens` (and `ignore_eos`).

Usage: python build_tiny_model.py OUTPUT_DIR
"""

import argparse
import os
import random
import sys
from pathlib import Path

# No network, ever; must be set before importing transformers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402

SEED = 1234
VOCAB_SIZE = 4096
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, IM_START, IM_END]  # ids 0..4
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def corpus(seed: int, n_lines: int = 20000) -> list[str]:
    """Deterministic pseudo-text: Zipf-distributed made-up words and numbers."""
    rng = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
              "z", "br", "ch", "cl", "dr", "fl", "gr", "pl", "pr", "sh", "st", "th", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ea", "ee", "oo", "ou", "y"]
    codas = ["", "", "n", "r", "s", "t", "l", "m", "nd", "ng", "st", "ck"]
    words = sorted({
        "".join(rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
                for _ in range(rng.randint(1, 4)))
        for _ in range(12000)
    })
    rng.shuffle(words)
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    punct = [".", ",", "?", "!", ";", ":"]
    lines = []
    for _ in range(n_lines):
        toks = rng.choices(words, weights=weights, k=rng.randint(4, 24))
        if rng.random() < 0.3:
            toks.insert(rng.randrange(len(toks)), str(rng.randint(0, 99999)))
        text = " ".join(toks)
        lines.append(text[0].upper() + text[1:] + rng.choice(punct))
    return lines


def build_tokenizer(seed: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    if tok.get_vocab_size() != VOCAB_SIZE:
        sys.exit(f"tokenizer vocab is {tok.get_vocab_size()}, wanted {VOCAB_SIZE}: grow the corpus")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed for text and weights (default {SEED})")
    args = parser.parse_args()

    tokenizer = build_tokenizer(args.seed)
    model = build_model(tokenizer, args.seed)
    assert model.config.vocab_size == len(tokenizer) == VOCAB_SIZE

    args.output_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.output_dir, safe_serialization=True)
    tokenizer.save_pretrained(args.output_dir)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.output_dir}: {n_params} parameters, vocab {len(tokenizer)}")


if __name__ == "__main__":
    main()
