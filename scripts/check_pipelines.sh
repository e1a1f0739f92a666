#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Checks the repository's shell scripts for pipelines that fail at random.
# Under `set -o pipefail` a pipeline fails when any of its commands does,
# and a command that writes into a pipe whose reader has already exited
# dies of SIGPIPE (status 141). Readers that stop early -- grep -q, -l or
# -m, head, awk with exit -- make that a race: it depends on whether the
# writer's last write comes before the reader exits (bash's builtin echo
# writes a multi-line string one line at a time). CI failed once this way
# (check_install.sh's `echo "$out" | head -1 | grep -qx ...`, about 3 times
# in 2,000 here). Test variables with a here-string (`grep -q x <<<"$v"`),
# `[[ $v == *x* ]]` or parameter expansion instead, or let the reader read
# everything (`sed -n 1p`, awk without exit).
#   scripts/check_pipelines.sh [source-dir]     every script there, or
#   scripts/check_pipelines.sh --files FILE...  those files only
# Scripts: *.sh, and files whose first line runs bash or sh, under scripts/,
# .ci/, tests/, tools/, integrations/, examples/ and python/. A script counts as
# using pipefail when a line sets it (set -o pipefail, set -euo pipefail,
# ...); a heredoc's body is not read (it is some other language's text).
# Exits 1 listing each finding as file:line: text.
set -euo pipefail

scan() { # files...
  awk -v q="'" '
    function flush(   i) { if (file_pipefail) for (i = 1; i <= n; i++) { print finding[i]; total++ }; n = 0 }
    BEGIN { heredoc_re = "<<-?[ \t]*[\"" q "]?[A-Za-z_][A-Za-z_0-9]*" }
    FNR == 1 { if (NR > 1) flush(); file_pipefail = 0; heredoc = "" }
    heredoc != "" { if ($0 ~ "^[ \t]*" heredoc "[ \t]*$") heredoc = ""; next }
    /^[ \t]*#/ { next }
    {
      line = $0
      if (line ~ /(^|[^A-Za-z_])set[ \t]+(-[a-zA-Z]+[ \t]+)*-[a-zA-Z]*o[ \t]+pipefail/) file_pipefail = 1
      if (line !~ /<<</ && match(line, heredoc_re)) {
        heredoc = substr(line, RSTART, RLENGTH)
        sub("^<<-?[ \t]*[\"" q "]?", "", heredoc)
      }
      # A pipe (not ||) into a reader that may exit before its writer ends.
      rest = line
      while (match(rest, /[^|]\|[^|]/)) {
        after = substr(rest, RSTART + 2)
        sub(/^[ \t]*/, "", after)
        if (after ~ /^grep([ \t]+[^|]*)?[ \t]-([a-zA-Z]*[qlm]|-quiet|-silent|-files-with-matches|-max-count)/ ||
            after ~ /^head([ \t]|$)/ ||
            after ~ /^awk[ \t][^|]*[{;][ \t]*exit([ \t;}]|$)/) {
          finding[++n] = FILENAME ":" FNR ": " line
          break
        }
        rest = substr(rest, RSTART + 2)
      }
    }
    END { flush(); exit total ? 1 : 0 }
  ' "$@"
}

self_test() {
  local dir
  dir=$(mktemp -d)
  trap 'rm -rf "$dir"' RETURN
  printf '%s\n' '#!/usr/bin/env bash' 'set -euo pipefail' 'out=$(printf "a\nb\n")' \
    'echo "$out" | head -1 | grep -qx a' >"$dir/bad_head.sh"
  printf '%s\n' '#!/usr/bin/env bash' 'set -o pipefail' 'echo "$1" | grep -q x && echo yes' >"$dir/bad_grep.sh"
  printf '%s\n' '#!/bin/bash' 'set -uo pipefail' 'v=$(ldconfig -p | awk "/libz/{print \$NF; exit}")' >"$dir/bad_awk"
  printf '%s\n' '#!/usr/bin/env bash' 'set -euo pipefail' 'grep -q x <<<"$1" || true' 'first=${1%%$'"'"'\n'"'"'*}' \
    'ls | sed -n 1p' 'a || grep -q x file' 'python3 - <<'"'"'PY'"'"'' 'print(1 | 2); x | head' 'PY' \
    '# echo "$v" | grep -q x' >"$dir/good.sh"
  printf '%s\n' '#!/usr/bin/env bash' 'echo "$1" | grep -q x' >"$dir/no_pipefail.sh"
  local found
  found=$(scan "$dir"/bad_head.sh "$dir"/bad_grep.sh "$dir"/bad_awk "$dir"/good.sh "$dir"/no_pipefail.sh || true)
  for f in bad_head.sh bad_grep.sh bad_awk; do
    grep -q "/$f:" <<<"$found" || { echo "check_pipelines: self-test: $f was not reported" >&2; exit 2; }
  done
  for f in good.sh no_pipefail.sh; do
    if grep -q "/$f:" <<<"$found"; then echo "check_pipelines: self-test: $f was reported: $found" >&2; exit 2; fi
  done
}

self_test
if [ "${1:-}" = --files ]; then
  shift
  files=("$@")
else
  root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
  files=()
  while IFS= read -r -d '' f; do
    case "$f" in
      */scripts/check_pipelines.sh) ;; # its self-test's text holds the patterns
      *.sh) files+=("$f") ;;
      *) first_line=""
         IFS= read -r first_line <"$f" 2>/dev/null || true
         [[ $first_line =~ ^\#\!(/usr/bin/env\ |/bin/)(ba)?sh ]] && files+=("$f") ;;
    esac
  done < <(find "$root/scripts" "$root/.ci" "$root/tests" "$root/tools" "$root/integrations" "$root/examples" "$root/python" \
                -type f \( -name '*.sh' -o ! -name '*.*' \) -print0 2>/dev/null)
fi
[ "${#files[@]}" -gt 0 ] || { echo "check_pipelines: no scripts found" >&2; exit 2; }
if findings=$(scan "${files[@]}"); then
  echo "check_pipelines: ${#files[@]} scripts, no pipeline into an early-exiting reader under pipefail"
else
  echo "check_pipelines: pipelines under pipefail into a reader that may exit before its writer (SIGPIPE, a random failure):" >&2
  echo "$findings" >&2
  exit 1
fi
