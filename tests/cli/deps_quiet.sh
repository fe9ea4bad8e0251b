#!/usr/bin/env bash
# scripts/deps.sh keeps apt's progress out of the job's output: with
# stand-ins for dpkg-query (every package missing) and apt-get (hundreds of progress
# lines) first on PATH, deps.sh prints two lines and leaves apt's output in a log; when
# apt-get fails, it exits 1 with the log's tail on stderr. Nothing is installed.
# Usage: bash deps_quiet.sh [ignored]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DEPS="$HERE/../../scripts/deps.sh"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$T/bin" "$T/tmp"
cat > "$T/bin/dpkg-query" <<'SH'
#!/usr/bin/env bash
echo "unknown ok not-installed"
SH
cat > "$T/bin/apt-get" <<'SH'
#!/usr/bin/env bash
for i in $(seq 1 300); do echo "Unpacking package-$i (1.0) ..."; done
[ "${FAKE_APT_FAIL:-0}" = 1 ] && { echo "E: Unable to locate package nope" >&2; exit 100; }
exit 0
SH
cat > "$T/bin/sudo" <<'SH'
#!/usr/bin/env bash
"$@"
SH
chmod +x "$T/bin/"*
PATH="$T/bin:$PATH" TMPDIR="$T/tmp" bash "$DEPS" > "$T/out.txt" 2>&1 || fail "deps.sh failed: $(cat "$T/out.txt")"
[ "$(wc -l < "$T/out.txt")" -eq 2 ] || fail "deps.sh printed $(wc -l < "$T/out.txt") lines: $(head -5 "$T/out.txt")"
grep -q "^qvg: installing Debian packages: .*apt's output: $T/tmp/qvg-apt\." "$T/out.txt" || fail "$(cat "$T/out.txt")"
log=$(ls "$T/tmp"/qvg-apt.*)
[ "$(grep -c Unpacking "$log")" -eq 600 ] || fail "apt's output is not in the log"
rc=0
PATH="$T/bin:$PATH" TMPDIR="$T/tmp" FAKE_APT_FAIL=1 bash "$DEPS" > "$T/out2.txt" 2> "$T/err2.txt" || rc=$?
[ "$rc" -eq 1 ] || fail "a failing apt-get: exit $rc"
grep -q "E: Unable to locate package nope" "$T/err2.txt" || fail "the failure's tail is not shown: $(cat "$T/err2.txt")"
grep -q "apt-get failed; its whole output is in" "$T/err2.txt" || fail "$(cat "$T/err2.txt")"
echo "deps_quiet.sh: OK"
