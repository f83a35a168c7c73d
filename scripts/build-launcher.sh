#!/bin/sh
# scripts/build-launcher.sh OUT PYTHON: compile the `sbx` launcher (sandboxer_tui/launcher.c)
# into OUT, for the interpreter PYTHON (the one it execs when no `sbx server` takes a command).
# `make setup` puts it in place of the Python `sbx` script pip wrote: a command handed to the
# server then starts no interpreter of its own. With no C compiler, OUT is left as it is
# (the Python launcher does the same work, about 9 ms slower per command).
set -eu
out=$1
python=$2
cc=${CC:-cc}
if ! command -v "$cc" >/dev/null 2>&1; then
  echo "build-launcher: no C compiler ($cc); $out stays the Python launcher" >&2
  exit 0
fi
case $python in
  *'"'* | *'\'*) echo "build-launcher: cannot name $python in C; $out left as it is" >&2; exit 0 ;;
esac
src=$(dirname "$0")/../sandboxer_tui/launcher.c
tmp=$out.build.$$
"$cc" -O2 -Wall -Wextra -o "$tmp" -DSBX_PYTHON="\"$python\"" "$src"
mv -f "$tmp" "$out"
