#!/usr/bin/env bash
# Fails when a layer reaches for something below its station.
set -u
root=$1
cd "$root" || exit 1
fail=0
check() { # check DESCRIPTION PATTERN PATHS...
  local what=$1 pat=$2
  shift 2
  local hits
  # Comment lines (starting with /*, * or //) may name anything.
  hits=$(grep -nE "$pat" "$@" 2>/dev/null | grep -v 'lint-ok' |
         grep -vE '^[^:]+:[0-9]+:[[:space:]]*(/\*|\*|//)')
  if [ -n "$hits" ]; then
    echo "layering: $what"
    echo "$hits"
    fail=1
  fi
}
pure=$(ls proto/*.[ch] transcode/*.[ch] engine/core/*.[ch] fabric/hr_rdma_sm.c 2>/dev/null)
core=$(ls proto/*.[ch] engine/core/*.[ch] 2>/dev/null)
[ -n "$pure" ] || { echo "no sources found"; exit 1; }
check "sockets, event loops or clocks in a sans-IO layer" \
  '#include <(sys/socket\.h|event2/|netinet/|sys/epoll\.h)|clock_gettime|gettimeofday|\btime\(' $pure
check "threads in the codec or the core" '#include <pthread\.h>' $core
check "direct allocation (use hr__mem_*)" \
  '(^|[^_a-z.>])(malloc|calloc|realloc|free)\(' $pure
bad=$(grep -l "event2/" include/hurray/*.h 2>/dev/null | grep -v "hr_event\.h")
[ -z "$bad" ] || { echo "layering: libevent included by $bad"; fail=1; }
if [ $fail -eq 0 ]; then echo "lint_layers: 1 passed, 0 failed"; fi
exit $fail
