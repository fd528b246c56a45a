#!/usr/bin/env python3
"""Builds Llama 3's tokenizer.json from llama.cpp's models/ggml-vocab-llama-bpe.gguf (its vocabulary,
token types and merges), the way Meta's tokenizer.json is made: a byte-level BPE with ignore_merges,
Llama 3's split regex, <|begin_of_text|> added in front, the 256 special tokens. Test data for
ctitan's tokenizer (tools/pydeps.sh runs it); uses the PyPI packages gguf and tokenizers.

    tools/llama3_tokenizer.py VOCAB.gguf OUTDIR     -> OUTDIR/tokenizer.json, tokenizer_config.json
"""
import json
import os
import sys

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def field(reader, name):
    f = reader.fields[name]
    return [f.parts[i] for i in f.data]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    reader = gguf.GGUFReader(sys.argv[1])
    tokens = [bytes(p).decode("utf-8") for p in field(reader, "tokenizer.ggml.tokens")]
    types = [int(p[0]) for p in field(reader, "tokenizer.ggml.token_type")]
    merges = [bytes(p).decode("utf-8") for p in field(reader, "tokenizer.ggml.merges")]
    control = 3
    vocab = {t: i for i, t in enumerate(tokens) if types[i] != control}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], ignore_merges=True,
                     fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    special = [AddedToken(t, special=True, normalized=False) for i, t in enumerate(tokens) if types[i] == control]
    tok.add_special_tokens(special)
    for i, t in enumerate(tokens):
        if types[i] == control and tok.token_to_id(t) != i:
            sys.exit(f"special token {t!r} got id {tok.token_to_id(t)}, not {i}")
    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                      special_tokens=[(bos, tok.token_to_id(bos))])])
    os.makedirs(sys.argv[2], exist_ok=True)
    tok.save(os.path.join(sys.argv[2], "tokenizer.json"))
    with open(os.path.join(sys.argv[2], "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": bos, "eos_token": eos, "model_max_length": 131072,
                   "tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": True}, f, indent=2)
    print(f"{sys.argv[2]}/tokenizer.json: {tok.get_vocab_size()} tokens, {len(merges)} merges")


if __name__ == "__main__":
    main()
