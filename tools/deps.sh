#!/usr/bin/env bash
# Installs the Debian packages ctitan needs; the Makefile runs it when a library is missing.
# Exits 0 when everything is present, installs with apt-get when run as root, else says what to run.
set -eu
# clang-14 and libclang-rt-14-dev: the sanitizer build and the fuzz harnesses that make test
# runs (make test-asan, make test-fuzz); the second holds libFuzzer and the sanitizer runtimes.
# libprotobuf-c-dev, protobuf-c-compiler (protoc-c) and libisal-dev (ISA-L: its CRC32C): the
# TensorBoard event files (stages/report/tb.c, stages/report/tb_event.proto).
# libjansson-dev: JSON as Hugging Face keeps it (config.json, tokenizer.json, safetensors
# headers, JSON Lines corpora); zlib1g-dev: gzip-compressed corpora.
pkgs=(build-essential pkg-config libzmq3-dev libmsgpack-dev liburing-dev libcmocka-dev
      libopenblas-dev libxxhash-dev fortunes clang-14 libclang-rt-14-dev
      libprotobuf-c-dev protobuf-c-compiler libisal-dev libjansson-dev zlib1g-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}" >&2
if [ "$(id -u)" -ne 0 ]; then
  echo "deps: not root; run: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}"
