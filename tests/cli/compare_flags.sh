#!/usr/bin/env bash
# `qvg compare` checks (docs/reliability.md, finding 17; spec 5: nothing lost)
# its destinations and flag combinations before any work: a --report DIR that cannot
# be created or written fails at once (not after the sweep), and every flag that
# only means something with --frontier, given without it, is an error naming both.
# Exit status 1 (the CLI's status for every error) and one "qvg: error: ..." line.
# Usage: bash compare_flags.sh /path/to/qvg
set -euo pipefail
QVG=${1:?usage: compare_flags.sh /path/to/qvg}
T=$(mktemp -d)
trap 'chmod -R u+w "$T" 2> /dev/null; rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The full default sweep takes minutes: a check made before it returns in seconds.
expect_fast_error() {  # NAME PATTERN -- command...
  local name=$1 pattern=$2
  shift 3
  local rc=0 t0 t1
  t0=$(date +%s)
  timeout 60 "$@" > "$T/out.txt" 2> "$T/err.txt" || rc=$?
  t1=$(date +%s)
  [ "$rc" -ne 124 ] || fail "$name: still running after 60 s (the check comes after the work)"
  [ "$rc" -eq 1 ] || fail "$name: exit status $rc, expected 1; stderr: $(head -c 300 "$T/err.txt")"
  [ $((t1 - t0)) -le 20 ] || fail "$name: took $((t1 - t0)) s before failing"
  [ "$(wc -l < "$T/err.txt")" -eq 1 ] || fail "$name: stderr is not one line: $(head -c 400 "$T/err.txt")"
  grep -q "^qvg: error: " "$T/err.txt" || fail "$name: stderr: $(cat "$T/err.txt")"
  grep -Eq -- "$pattern" "$T/err.txt" || fail "$name: stderr does not match '$pattern': $(cat "$T/err.txt")"
  [ ! -s "$T/out.txt" ] || fail "$name: printed a result"
}

touch "$T/file"
expect_fast_error "--report under a regular file" "--report.*$T/file/rep.*(Not a directory|not a directory)" -- \
  "$QVG" compare --frontier --report "$T/file/rep"
expect_fast_error "--report is a regular file" "--report.*$T/file" -- "$QVG" compare --frontier --report "$T/file"
if [ "$(id -u)" -ne 0 ]; then  # root writes anywhere
  mkdir "$T/ro"
  chmod a-w "$T/ro"
  expect_fast_error "--report not writable" "--report.*$T/ro.*(cannot|Permission denied)" -- \
    "$QVG" compare --frontier --report "$T/ro"
  expect_fast_error "--report in a read-only directory" "--report.*$T/ro/new" -- \
    "$QVG" compare --frontier --report "$T/ro/new"
  [ -z "$(ls -A "$T/ro")" ] || fail "a probe file was left in $T/ro"
fi

# --frontier-only flags without --frontier.
for flags in "--frontier-quick" "--report $T/rep" "--bpe-slack 0.2" "--max-queries 10" "--rounds 2"; do
  # shellcheck disable=SC2086
  expect_fast_error "$flags without --frontier" "${flags%% *}.*--frontier" -- "$QVG" compare $flags
done
[ ! -e "$T/rep" ] || fail "--report without --frontier created its directory"
# --frontier and --warm-start are two different runs: not both.
expect_fast_error "--frontier --warm-start" "--warm-start.*--frontier|--frontier.*--warm-start" -- \
  "$QVG" compare --frontier --warm-start

# A good --report directory passes the check and the check leaves nothing behind
# (missing directories and the probe file are removed again; the report writer
# creates them at the end): a sweep stopped after 3 s has no directory.
rc=0
timeout 3 "$QVG" compare --frontier --report "$T/new/rep" > /dev/null 2> "$T/err.txt" || rc=$?
[ "$rc" -eq 124 ] || fail "--frontier --report NEW: exit status $rc before 3 s: $(head -c 300 "$T/err.txt")"
[ ! -e "$T/new" ] || fail "the --report check left $(find "$T/new")"
mkdir "$T/old"
rc=0
timeout 3 "$QVG" compare --frontier --report "$T/old" > /dev/null 2> "$T/err.txt" || rc=$?
[ "$rc" -eq 124 ] || fail "--frontier --report OLD: exit status $rc before 3 s: $(head -c 300 "$T/err.txt")"
[ -d "$T/old" ] && [ -z "$(ls -A "$T/old")" ] || fail "the --report check changed an existing directory"

echo "compare_flags: OK"
