#!/usr/bin/env python3
"""Convert the locally built tiny HF model to GGUF with llama.cpp's own converter.

Why a wrapper: `convert_hf_to_gguf.py` identifies a BPE tokenizer's
pre-tokenizer by hashing how it splits a fixed test string and comparing the
hash with a list of known Hub models.  The tiny model's tokenizer (trained
locally by build_tiny_model.py, byte-level BPE with the default GPT-2 split
regex) is on no such list, so the stock converter stops with
"BPE pre-tokenizer was not recognized".  This wrapper keeps the converter
unchanged and only answers "gpt-2" when the hash is unknown, which is the
pre-tokenizer that `tokenizers`' ByteLevel(use_regex=True) implements.

Usage: python llamacpp_convert.py LLAMA_CPP_DIR HF_MODEL_DIR OUT.gguf [--outtype f32|f16]
Needs numpy, torch, safetensors, transformers, pyyaml, tqdm, requests in the
interpreter; gguf-py is taken from LLAMA_CPP_DIR/gguf-py.
"""

import os
import runpy
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    llama_dir = Path(sys.argv[1]).resolve()
    hf_dir, out_file, rest = sys.argv[2], sys.argv[3], sys.argv[4:]
    if not rest:
        rest = ["--outtype", "f32"]

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    sys.path.insert(0, str(llama_dir / "gguf-py"))
    sys.path.insert(0, str(llama_dir))

    from conversion import base  # the converter's own package

    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            print("llamacpp_convert: unknown BPE pre-tokenizer hash, using 'gpt-2'", file=sys.stderr)
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    sys.argv = [str(llama_dir / "convert_hf_to_gguf.py"), hf_dir, "--outfile", out_file, *rest]
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
