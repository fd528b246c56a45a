#!/usr/bin/env python3
"""How closely a tokenizer.json converted from ctitan's tokenizer.bin encodes as ctitan does
(test_hf_export).

  hf_tok_agree.py TOKENIZER_JSON DOCS IDS

DOCS: documents as [uint32 length][bytes] records; IDS: ctitan's tok_encode of each, as
[uint32 count][count uint32] records (little-endian). Each document that is valid UTF-8 is
encoded with the `tokenizers` library and compared token for token; decode(encode(x)) == x is
checked too. Prints one line of JSON: documents, bytes, documents and tokens that agree, the
documents that are not UTF-8 (the library takes only text), round-trip failures, and the first
few disagreements.
"""
import json
import struct
import sys

from tokenizers import Tokenizer


def records(path, item):
    data = open(path, "rb").read()
    off = 0
    while off < len(data):
        (n,) = struct.unpack_from("<I", data, off)
        off += 4
        if item == 1:
            yield data[off:off + n]
            off += n
        else:
            yield list(struct.unpack_from("<%dI" % n, data, off))
            off += 4 * n


def main():
    tok = Tokenizer.from_file(sys.argv[1])
    docs = list(records(sys.argv[2], 1))
    ids = list(records(sys.argv[3], 4))
    assert len(docs) == len(ids), (len(docs), len(ids))
    r = {"docs": len(docs), "bytes": sum(map(len, docs)), "not_utf8": 0, "docs_agree": 0, "tokens": 0,
         "tokens_agree": 0, "roundtrip_fail": 0, "examples": []}
    texts, want = [], []
    for d, i in zip(docs, ids):
        try:
            texts.append(d.decode("utf-8"))
            want.append(i)
        except UnicodeDecodeError:
            r["not_utf8"] += 1
    for text, w, enc in zip(texts, want, tok.encode_batch(texts, add_special_tokens=False)):
        got = enc.ids
        r["tokens"] += len(w)
        if got == w:
            r["docs_agree"] += 1
            r["tokens_agree"] += len(w)
        else:
            same = sum(1 for a, b in zip(got, w) if a == b)
            r["tokens_agree"] += same
            if len(r["examples"]) < 3:
                k = next((j for j in range(min(len(got), len(w))) if got[j] != w[j]), min(len(got), len(w)))
                r["examples"].append({"at": k, "text": text[:80], "hf": got[k:k + 4], "ctitan": w[k:k + 4]})
        if tok.decode(got, skip_special_tokens=False) != text:
            r["roundtrip_fail"] += 1
    print(json.dumps(r))


if __name__ == "__main__":
    main()
