#!/usr/bin/env python3
"""Reference encodings for tests/test_hftok.c, from the `tokenizers` library.

usage: hf_tok.py OUT LLAMA3_TOKENIZER_JSON

Writes into OUT:
  corpus.bin            the test corpus: documents, each u32 length + bytes (little-endian)
  llama3.ids            for each document: u32 count + u32 ids, as Llama 3's tokenizer.json gives
  trained/tokenizer.json  a byte-level BPE trained here (BpeTrainer, ByteLevel use_regex) with
                        special tokens and added tokens with lstrip/rstrip and single_word; trained.ids (the
                        documents before those of every code point)
  prefix/tokenizer.json   the same with ByteLevel add_prefix_space; prefix.ids (the same)
The corpus (over 1 MB): fortunes (when installed), every code point once, and synthetic hard
cases: CJK, emoji and ZWJ sequences, combining marks, Arabic/Hebrew, digit runs, contractions
in any case, whitespace mixes, control characters, NUL, and random mixes of all of these.
"""
import glob
import json
import os
import random
import struct
import sys

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

WS = [chr(c) for c in (9, 10, 11, 12, 13, 32, 0x85, 0xA0, 0x1680, 0x2000, 0x2005, 0x200A, 0x2028,
                       0x2029, 0x202F, 0x205F, 0x3000)]
PIECES = (["a", "Z", "é", "ß", "Ω", "ж", "ſ", "中", "文", "字", "あ", "한", "ا", "ل", "ש", "ם", "0", "7",
           "٣", "５", "Ⅻ", "½", "²", "'", "'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL",
           "'d", "'ſ", "!", "?", ".", ",", "-", "_", "(", "\"", "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "\u200d",
           "\u0301", "\u0308", "e\u0301", "\u0000", "\u0001", "\u001b", "\u007f", "<|", "|>", "<",
           "<|endoftext|>", "<sep>", "<|begin_of_text|>", "<|end_of_text|>", "\ufeff", "\U0010ffff",
           "\ue000", "<w>", "<w>", "_", "\u0345", "\u2160", "\u203f", "\u20dd", "\u2070"] + WS * 3)


def synthetic(rng):
    docs = []
    for n in range(1, 41):  # digit runs of every length, in several scripts
        docs.append("x" + "".join(rng.choice("0123456789") for _ in range(n)) + " ١٢٣٤٥٦٧٨٩٠"[:n % 11])
    for w in ("I'M", "you'RE", "they'Ve", "it's", "IT'S", "we'LL", "he'D", "she'll", "'s'S'ſ"):
        docs.append(w + " " + w.upper() + " " + w.lower())
    docs += ["中文字符測試，日本語のテキスト。한국어 텍스트", "👨‍👩‍👧‍👦 family 👍🏽🇫🇷🇩🇪 flags",
             "mañana e\u0301 a\u0308\u0323 combining", "مرحبا بالعالم ١٢٣ שלום עולם 456",
             " \t\r\n  \n\n\t x  \r\r\n y\u3000\u3000z   ", "\u0000\u0001\u0002 ctl \u001f\u007f",
             "", " ", "\n", "   ", "a", "'", "''s", "x'", " ' s"]
    for _ in range(3000):  # random mixes of everything above
        docs.append("".join(rng.choice(PIECES) for _ in range(rng.randrange(0, 60))))
    tight = [" ", "\t", "\n", "\r", "a", "1", "!", "'", "s", "S", "ſ", "re", "\u3000", "\u0301", "\xa0",
             "_", "\u0663", "\u00b2"]
    for _ in range(6000):  # short strings at the scanners' boundaries
        docs.append("".join(rng.choice(tight) for _ in range(rng.randrange(1, 12))))
    for _ in range(200):  # long whitespace runs
        docs.append("".join(rng.choice(WS[:6] + ["a", "!", "1"]) for _ in range(rng.randrange(1, 400))))
    return docs


def every_code_point(rng):
    cps = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]
    docs = []
    for i in range(0, len(cps), 4096):
        block = [chr(c) for c in cps[i:i + 4096]]
        out = []
        for ch in block:  # each next to letters, digits, spaces and punctuation
            out.append(ch)
            if rng.random() < 0.3:
                out.append(rng.choice(["a", " ", "1", "!", "'", "\n", "é"]))
        docs.append("".join(out))
    return docs


def fortunes(limit):
    docs, total = [], 0
    for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
        if path.endswith(".dat") or os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for d in f.read().split("\n%\n"):
                docs.append(d)
                total += len(d)
                if total > limit:
                    return docs
    return docs


def write_ids(path, tok, docs):
    with open(path, "wb") as f:
        for e in tok.encode_batch(docs, add_special_tokens=False):
            f.write(struct.pack("<I", len(e.ids)) + struct.pack("<%dI" % len(e.ids), *e.ids))


def train(docs):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|endoftext|>", "<pad>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=tr)
    tok.add_tokens([AddedToken("<sep>", lstrip=True, rstrip=True, normalized=False),
                    AddedToken("[x]", normalized=True),
                    AddedToken("<w>", single_word=True, normalized=False)])
    return tok


def main():
    out, llama3 = sys.argv[1], sys.argv[2]
    rng = random.Random(23)
    text = fortunes(1_100_000) + synthetic(rng)
    docs = text + every_code_point(rng)
    with open(os.path.join(out, "corpus.bin"), "wb") as f:
        for d in docs:
            b = d.encode("utf-8")
            f.write(struct.pack("<I", len(b)) + b)
    write_ids(os.path.join(out, "llama3.ids"), Tokenizer.from_file(llama3), docs)
    tok = train(text[:4000])
    for name, prefix in (("trained", False), ("prefix", True)):
        os.makedirs(os.path.join(out, name), exist_ok=True)
        j = json.loads(tok.to_str())
        j["pre_tokenizer"]["add_prefix_space"] = prefix
        path = os.path.join(out, name, "tokenizer.json")
        with open(path, "w") as f:
            json.dump(j, f)
        write_ids(os.path.join(out, name + ".ids"), Tokenizer.from_file(path), text)


if __name__ == "__main__":
    main()
