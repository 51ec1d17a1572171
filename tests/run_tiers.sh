#!/usr/bin/env bash
# The test run of `make test`: the tiers in two pytest runs side by side, then the tests that
# measure wall time against a bound (marked `alone`) in a run of their own.
#
# Why side by side: the emulator, e2e and faults tiers spend most of their time waiting (on the
# emulators' push pacing, leases, restarts), while unit, contract and selfcheck keep one CPU busy.
# One after the other the suite took about 27 minutes on a 2-core machine; side by side the two
# runs share the CPUs that one run left idle. Each run starts the emulators it needs on free
# ports and stops them; nothing is shared but the read-only venv. A test whose verdict is a
# wall-time bound (`/healthz` within 100 ms during a burst, an exit within Cloud Run's 10 s) is
# marked `alone` and runs after both, with the machine to itself.
#
# Usage: tests/run_tiers.sh PYTEST [pytest options...]   (the options go to every run)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pytest=${1:?usage: tests/run_tiers.sh PYTEST [options]}
shift

busy_tiers=(tests/unit tests/contract tests/selfcheck)
waiting_tiers=(tests/emulator tests/e2e tests/faults)
# A tier folder in neither list would never run here: refuse to pass without it.
for dir in tests/*/; do
    dir=${dir%/}
    if compgen -G "$dir/test_*.py" >/dev/null && [[ " ${busy_tiers[*]} ${waiting_tiers[*]} " != *" $dir "* ]]; then
        echo "tests/run_tiers.sh: $dir has tests but is in neither run: add it to busy_tiers or waiting_tiers" >&2
        exit 1
    fi
done

out=$(mktemp -d)
waiting=
stop() {
    if [[ -n "$waiting" ]]; then kill "$waiting" 2>/dev/null; wait "$waiting" 2>/dev/null; fi
    rm -rf "$out"
}
trap stop EXIT
trap 'exit 130' INT TERM

# The waiting tiers' output is kept and printed whole once they end (two runs' dots on one
# terminal read as neither); the cache plugin is the other run's (both writing it race).
"$pytest" -q -m "not alone" -p no:cacheprovider "${waiting_tiers[@]}" "$@" >"$out/waiting.log" 2>&1 &
waiting=$!
echo "== tests/unit, tests/contract, tests/selfcheck (tests/emulator, tests/e2e, tests/faults run beside them)"
"$pytest" -q -m "not alone" "${busy_tiers[@]}" "$@"
busy=$?
wait "$waiting"
waited=$?
waiting=
echo "== tests/emulator, tests/e2e, tests/faults"
cat "$out/waiting.log"
echo "== the tests marked alone (a wall-time bound), with the machine to themselves"
"$pytest" -q -m alone "$@"
alone=$?

echo "tests: unit/contract/selfcheck exit $busy, emulator/e2e/faults exit $waited, alone exit $alone"
if (( busy || waited || alone )); then exit 1; fi
