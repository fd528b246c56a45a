#!/usr/bin/env bash
# The Python that tests compare ctitan against (never the product's: ctitan needs no Python).
# `make test` runs it (in ~/.cache/ctitan/py, or CTITAN_PY: once per machine, a quick check after);
# a test that needs it reads OUT/ok and skips with the reason in OUT/why when it could not be set
# up. What it makes, in OUT (the argument; default build/py):
#   venv/            python3 -m venv --system-site-packages over Debian's python3-torch (PyPI's
#                    torch is gigabytes of CUDA), with transformers, tokenizers, safetensors and
#                    gguf from PyPI at pinned versions (transformers 4.46 still runs on torch 1.13)
#   llama3/          a real Llama 3 vocabulary: llama.cpp's models/ggml-vocab-llama-bpe.gguf, as
#                    the source distribution of llama-cpp-python vendors it, turned into
#                    tokenizer.json by tools/llama3_tokenizer.py; with the .inp/.out pairs
#                    llama.cpp tests its tokenizer with
#   ok | why         done, or why not (one line)
# Run as root it installs the Debian packages it needs (apt-get); otherwise it says which.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$here/build/py}
mkdir -p "$out"
# done before, and neither this script nor the vocabulary builder changed since
[ -e "$out/ok" ] && [ "$out/ok" -nt "$0" ] && [ "$out/ok" -nt "$here/tools/llama3_tokenizer.py" ] && exit 0
rm -f "$out/ok" "$out/why"
fail() { echo "$*" > "$out/why"; echo "pydeps: $* (tests that compare against Python will skip)" >&2; exit 0; }

pkgs=(python3-torch python3-venv python3-numpy)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" -eq 0 ] || fail "not root: run sudo apt-get install -y --no-install-recommends ${missing[*]}"
  echo "pydeps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2 ||
    fail "apt-get install ${missing[*]} failed"
fi

py=/usr/bin/python3 # Debian's: python3-torch is installed for it, whatever python3 PATH finds first
venv=$out/venv
if [ ! -x "$venv/bin/python" ]; then
  "$py" -m venv --system-site-packages "$venv" >&2 || fail "$py -m venv failed"
fi
want="transformers==4.46.3 tokenizers==0.20.3 safetensors==0.8.0 gguf==0.19.0"
if ! "$venv/bin/python" -c 'import torch, transformers, tokenizers, safetensors, gguf' 2>/dev/null; then
  echo "pydeps: pip install $want" >&2
  "$venv/bin/python" -m pip install -q --disable-pip-version-check $want "numpy<2" >&2 ||
    fail "pip install $want failed"
fi
"$venv/bin/python" -c 'import torch, transformers, tokenizers, safetensors, gguf' 2>/dev/null ||
  fail "the venv cannot import torch, transformers, tokenizers, safetensors and gguf"

voc=$out/llama3
if [ ! -s "$voc/tokenizer.json" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  "$venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    llama-cpp-python==0.3.36 -d "$tmp" >&2 || fail "pip download llama-cpp-python==0.3.36 failed"
  tar xzf "$tmp"/llama_cpp_python-0.3.36.tar.gz -C "$tmp" --wildcards '*/models/ggml-vocab-llama-bpe.gguf*' ||
    fail "llama-cpp-python's source has no models/ggml-vocab-llama-bpe.gguf"
  mkdir -p "$voc"
  cp "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf* "$voc/"
  "$venv/bin/python" "$here/tools/llama3_tokenizer.py" "$voc/ggml-vocab-llama-bpe.gguf" "$voc" >&2 ||
    fail "tools/llama3_tokenizer.py could not build tokenizer.json"
fi
touch "$out/ok"
