#!/bin/sh
# scripts/build-launcher.sh OUT PYTHON: compile the `sbx` launcher (sandboxer_tui/server/launcher.c)
# into OUT, for the interpreter PYTHON (the one it execs when no `sbx server` takes a command).
# `make setup` puts it in place of the Python `sbx` script pip wrote: a command handed to the
# server then starts no interpreter of its own. With no working C compiler (none, or one
# without the C library's headers), OUT is left as it is: the Python launcher does the same
# work, about 10 ms slower per command. $CC picks the compiler (default: cc).
set -eu
out=$1
python=$2
cc=${CC:-cc}
keep() {
  echo "build-launcher: $1; $out stays the Python launcher" >&2
  exit 0
}
command -v "${cc%% *}" >/dev/null 2>&1 || keep "no C compiler ($cc)"
case $python in
  *'"'* | *'\'*) keep "$python cannot be named in C" ;;
esac
src=$(dirname "$0")/../sandboxer_tui/server/launcher.c
tmp=$out.build.$$
# $cc unquoted on purpose: CC may carry arguments ("ccache gcc")
if ! $cc -O2 -Wall -Wextra -o "$tmp" -DSBX_PYTHON="\"$python\"" "$src" 2>"$tmp.log"; then
  sed -n 1,5p "$tmp.log" >&2
  rm -f "$tmp" "$tmp.log"
  keep "$cc could not build it"
fi
cat "$tmp.log" >&2
rm -f "$tmp.log"
mv -f "$tmp" "$out"
