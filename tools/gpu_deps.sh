#!/usr/bin/env bash
# Collects the Debian runtime libraries that ctitan's built programs load and a bare CUDA machine
# lacks (ZeroMQ, msgpack-c, liburing, OpenBLAS, xxHash, protobuf-c, ISA-L, cmocka and what they
# load in turn) as .debs unpacked into .gpu-deps/root, a folder carried with a GPU run; prints
# LD_LIBRARY_PATH.
#
# Run here, on the build machine (Debian 12, apt works), after `make`:
#   bash tools/gpu_deps.sh [BUILD_DIR]          (default: build)
# The package list is what `ldd` resolves for every program in BUILD_DIR, mapped to packages
# with `dpkg -S`, less the base system (glibc, libgcc, libstdc++) and CUDA (not from a .deb).
# The .debs are the installed versions, the ones the programs were built against. Running it
# again downloads nothing new and rebuilds .gpu-deps/root from the same .debs.
# On the GPU machine, from the repository root: `. .gpu-deps/env.sh` (prepends the folders to
# LD_LIBRARY_PATH). Carry .gpu-deps/root and .gpu-deps/env.sh, not .gpu-deps/debs.
set -euo pipefail

cd "$(dirname "$0")/.."
build=${1:-build}
out=.gpu-deps
# Present on any machine that runs our binaries, and tied to its glibc: never carried.
base_pkgs=" libc6 libgcc-s1 libstdc++6 "

die() { echo "gpu_deps: $*" >&2; exit 1; }

mapfile -t progs < <(find "$build/bin" "$build/tests" -maxdepth 2 -type f -perm -u+x 2>/dev/null | sort)
[ ${#progs[@]} -gt 0 ] || die "no programs under $build/bin or $build/tests: run make (BUILD=$build) first"

# Every library the programs load, as the loader resolves it here: its name (the NEEDED
# soname) and where it is, which dpkg maps to a package.
built=$(cd "$build" && pwd -P)
declare -A pkgset=() soname=()
while read -r name lib; do
  pkg=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null || true)
  pkg=${pkg%%:*}
  pkg=${pkg%%,*}
  if [ -z "$pkg" ]; then
    case "$(readlink -f "$lib")" in
      /usr/local/cuda*) continue ;; # CUDA: the GPU machine's own
      "$built"/*) continue ;;       # ours (build/lib: the profiler's libcupti copy), carried with it
      *) die "$lib is not from a Debian package: cannot carry it" ;;
    esac
  fi
  [[ $base_pkgs == *" $pkg "* ]] && continue
  pkgset[$pkg]=1
  soname[$name]=1
done < <(for p in "${progs[@]}"; do ldd "$p" 2>/dev/null || true; done |
           awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u)
mapfile -t pkgs < <(printf '%s\n' "${!pkgset[@]}" | sort)
[ ${#pkgs[@]} -gt 0 ] || die "ldd found no libraries to carry (is $build built?)"
for want in libzmq5 libmsgpackc2 liburing2 libopenblas0-pthread libxxhash0 libprotobuf-c1 libisal2; do
  [[ " ${pkgs[*]} " == *" $want "* ]] || die "expected $want among the programs' libraries; got: ${pkgs[*]}"
done

# .debs of the installed versions, each downloaded once.
mkdir -p "$out/debs"
declare -A keep=()
for pkg in "${pkgs[@]}"; do
  ver=$(dpkg-query -W -f='${Version}' "$pkg")
  deb=""
  for f in "$out"/debs/*.deb; do
    [ -e "$f" ] || continue
    if [ "$(dpkg-deb -f "$f" Package)" = "$pkg" ] && [ "$(dpkg-deb -f "$f" Version)" = "$ver" ]; then
      deb=$f
      break
    fi
  done
  if [ -z "$deb" ]; then
    echo "gpu_deps: downloading $pkg=$ver" >&2
    # APT::Sandbox::User=root: the _apt user may not write into this checkout.
    (cd "$out/debs" && apt-get -q -o APT::Sandbox::User=root download "$pkg=$ver" >/dev/null) ||
      die "apt-get download $pkg=$ver failed (run apt-get update? is the installed version still in the archive?)"
    for f in "$out"/debs/"${pkg}"_*.deb; do
      [ "$(dpkg-deb -f "$f" Version)" = "$ver" ] && deb=$f
    done
    [ -n "$deb" ] || die "downloaded $pkg but found no .deb of version $ver"
  fi
  keep[$deb]=1
done
for f in "$out"/debs/*.deb; do # versions no longer installed
  [ -n "${keep[$f]:-}" ] || { echo "gpu_deps: removing stale $f" >&2; rm -f "$f"; }
done

# Unpacked from scratch each time, pruned to the libraries the programs load (and the files
# those names link to), then swapped in whole. Docs, LAPACK, krb5 plugins and the like stay
# behind, so nothing else is offered to the GPU machine's own programs (PyTorch) through
# LD_LIBRARY_PATH, and the carried folder stays small.
new=$(pwd)/$out/root.new
rm -rf "$new"
mkdir -p "$new"
for deb in "${!keep[@]}"; do
  dpkg -x "$deb" "$new"
done
declare -A keepfile=()
for name in "${!soname[@]}"; do
  found=0
  while read -r f; do
    keepfile[$f]=1
    keepfile[$(readlink -f "$f")]=1
    found=1
  done < <(find "$new" -name "$name" \( -type f -o -type l \))
  [ "$found" -eq 1 ] || die "$name is in none of the unpacked packages"
done
while read -r f; do
  [ -n "${keepfile[$f]:-}" ] || rm -f "$f"
done < <(find "$new" \( -type f -o -type l \))
find "$new" -depth -type d -empty -delete
rm -rf "$out/root"
mv "$new" "$out/root"

# Library folders: usr/lib/x86_64-linux-gnu, lib/x86_64-linux-gnu where a package still uses
# it, and openblas-pthread/, whose libopenblas.so.0 is normally reached through an
# update-alternatives link that dpkg -x does not create.
mapfile -t dirs < <(find "$out/root" -name 'lib*.so*' \( -type f -o -type l \) -printf '%h\n' | sort -u)
abs=$(pwd)/$out
ldpath="" envpath=""
for d in "${dirs[@]}"; do
  ldpath+="${ldpath:+:}$(pwd)/$d"
  envpath+="${envpath:+:}\$d/${d#"$out"/}"
done
{
  echo "# Written by tools/gpu_deps.sh. On the GPU machine, from the repository root (any sh):"
  echo "#   . $out/env.sh        puts the carried libraries first in LD_LIBRARY_PATH"
  echo "d=\$PWD/$out"
  echo "if [ -d \"\$d/root\" ]; then"
  echo "  export LD_LIBRARY_PATH=\"$envpath\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""
  echo "else"
  echo "  echo \"$out/env.sh: no \$d/root (source it from the repository root)\" >&2"
  echo "fi"
  echo 'unset d'
  # cuDNN's fused attention (kernels/cuda/cudnn_sdpa.c) loads libcudnn.so.9 at run time: the copy
  # PyTorch's installation brings (the one the PyTorch bench runs; a system copy may be older),
  # else the loader's
  echo 'if [ -z "${CTITAN_CUDNN_LIB:-}" ]; then'
  # (torch's folder found without importing torch: its import takes seconds of a lease)
  echo '  for f in $(python3 -c "import glob, importlib.util as u; d = u.find_spec(\"torch\").submodule_search_locations[0]; print(\" \".join(glob.glob(d + \"/../nvidia/cudnn/lib/libcudnn.so.9\") + glob.glob(d + \"/lib/libcudnn.so.9\")))" 2>/dev/null); do'
  echo '    [ -f "$f" ] && export CTITAN_CUDNN_LIB="$f" && break'
  echo '  done'
  echo '  unset f'
  echo 'fi'
} >"$out/env.sh"

# Check: with only this path, every library of every program that is not base system or CUDA
# resolves inside $out.
bad=0
for p in "${progs[@]}"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case "$path" in
      "$abs"/*|/usr/local/cuda*|"$built"/*) ;;
      /*)
        pkg=$(dpkg -S "$path" 2>/dev/null || dpkg -S "$(readlink -f "$path")" 2>/dev/null || true)
        [[ $base_pkgs == *" ${pkg%%:*} "* ]] || { echo "gpu_deps: $p: $name resolves to $path" >&2; bad=1; } ;;
      *) echo "gpu_deps: $p: $name not found" >&2; bad=1 ;;
    esac
  done < <(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$ldpath" ldd "$p")
done
[ "$bad" -eq 0 ] || die "some libraries do not resolve inside $out"

echo "gpu_deps: ${#pkgs[@]} packages in $out/root (${#progs[@]} programs checked): ${pkgs[*]}" >&2
echo "gpu_deps: on the GPU machine, from the repository root: . $out/env.sh" >&2
echo "LD_LIBRARY_PATH=$ldpath"
