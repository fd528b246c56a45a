#!/usr/bin/env python3
"""What tests/test_finetune.c fine-tunes: a Hugging Face folder as a user brings one, and text.

  hf_finetune.py DIR

writes DIR/model/ (a random small Llama written by transformers' save_pretrained, bf16 with tied
embeddings as Llama 3.2 has them, with a byte-level BPE tokenizer.json trained here by the
tokenizers library on the fortunes, its BOS and EOS in tokenizer_config.json) and the corpus
DIR/data/a.jsonl.gz and DIR/data/b.jsonl (a fortune a line, in the field "text").
"""
import glob
import gzip
import json
import os
import subprocess
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers


def fortunes():
    docs = []
    for f in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if os.path.isfile(f) and not f.endswith((".dat", ".u8")):
            try:
                docs += [d.strip() for d in open(f, encoding="utf-8").read().split("\n%\n") if d.strip()]
            except UnicodeDecodeError:
                pass
    return docs


def main():
    out = sys.argv[1]
    docs = fortunes()
    if len(docs) < 4000:
        sys.exit(f"hf_finetune: only {len(docs)} fortunes in /usr/share/games/fortunes")
    bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=512, special_tokens=[bos, eos],
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = os.path.join(out, "model")
    here = os.path.dirname(os.path.abspath(__file__))
    subprocess.run([sys.executable, os.path.join(here, "hf_llama.py"), model, "--dtype", "bfloat16", "--tied",
                    "--vocab", str(tok.get_vocab_size()), "--max-pos", "128"], check=True, capture_output=True)
    tok.save(os.path.join(model, "tokenizer.json"))
    with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": bos, "eos_token": eos, "tokenizer_class": "PreTrainedTokenizerFast"}, f)
    data = os.path.join(out, "data")
    os.makedirs(data, exist_ok=True)
    with gzip.open(os.path.join(data, "a.jsonl.gz"), "wt") as f:
        for d in docs[:2000]:
            f.write(json.dumps({"text": d}) + "\n")
    with open(os.path.join(data, "b.jsonl"), "w") as f:
        for d in docs[2000:4000]:
            f.write(json.dumps({"text": d}) + "\n")
    print(f"hf_finetune: {model} (vocab {tok.get_vocab_size()}), {data}: 2 x 2000 documents")


if __name__ == "__main__":
    main()
