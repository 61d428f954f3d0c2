#!/usr/bin/env bash
# Run the whole test suite N times on a fresh clone while other processes keep the
# CPU busy, so that a test depending on wall-clock timing or an idle machine shows
# up as a failed run. Prints "K passed runs of N"; exits 1 unless every run passed.
#
# usage: bench/soak.sh [N]                          N defaults to 10
#
#   SOAK_HOGS=2          busy processes (`yes > /dev/null`) during the runs; default
#                        one less than the cores, at least 1 (the "other core")
#   SOAK_VENV=.venv      reuse an installed venv: lint and test with its tools, and
#                        never pip-install (no network; the clone's code still runs
#                        first, through PYTHONPATH). Without it, `make lint` builds
#                        the clone's own venv.
#   SOAK_DIRTY=1         test the working tree, not HEAD: apply the uncommitted
#                        diff and copy untracked files into the clone
#   SOAK_LINT=0          skip ruff and mypy (work in progress that does not lint)
#   SOAK_KEEP=1          keep the clone and the run logs
#   SOAK_WORKERS=4       pytest-xdist workers of the parallel part (as make test)
#
# The clone is of what is committed (unless SOAK_DIRTY=1), so commit first.
set -euo pipefail

runs=${1:-10}
if ! [[ $runs =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: bench/soak.sh [N]" >&2
    exit 2
fi
cores=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
hogs=${SOAK_HOGS:-$((cores > 1 ? cores - 1 : 1))}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
work=$(mktemp -d)
clone="$work/x"
hog_pids=()

cleanup() {
    for pid in ${hog_pids[@]+"${hog_pids[@]}"}; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    if [[ ${SOAK_KEEP:-0} == 1 ]]; then
        echo "kept $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

git clone --quiet "$root" "$clone"
if [[ ${SOAK_DIRTY:-0} == 1 ]]; then
    git -C "$root" diff HEAD --binary | git -C "$clone" apply --allow-empty
    git -C "$root" ls-files --others --exclude-standard -z |
        (cd "$root" && xargs -0 -r cp --parents -t "$clone")
fi
echo "soak: $runs runs in $clone, $hogs busy process(es)" >&2

cd "$clone"
lint=${SOAK_LINT:-1}
if [[ -n ${SOAK_VENV:-} ]]; then
    bin=$(cd "$root" && cd "$SOAK_VENV" && pwd)/bin
    export PYTHONPATH="$clone"
    if [[ $lint == 1 ]]; then
        "$bin/ruff" check service tests bench
        "$bin/ruff" format --check service tests bench
        "$bin/mypy"
    fi
else
    bin="$clone/.venv/bin"
    if [[ $lint == 1 ]]; then
        make lint
    else
        make .venv/.dev
    fi
fi

for _ in $(seq "$hogs"); do
    yes >/dev/null &
    hog_pids+=($!)
done

"$bin/python" -m compileall -q -j0 service tests >/dev/null  # as make test does

passed=0
for run in $(seq "$runs"); do
    log="$work/run-$run.log"
    started=$SECONDS
    # as `make test` runs it: the parallel part, then the timing tests on two
    if "$bin/pytest" -q -p no:cacheprovider -n "${SOAK_WORKERS:-4}" --dist loadscope \
        --no-loadscope-reorder -m "not timing" >"$log" 2>&1 &&
        "$bin/pytest" -q -p no:cacheprovider -n 2 --dist loadscope \
            --no-loadscope-reorder -m timing \
            $(grep -l 'mark.timing' tests/test_*.py) >>"$log" 2>&1; then
        passed=$((passed + 1))
        echo "run $run: passed in $((SECONDS - started)) s" >&2
    else
        echo "run $run: FAILED in $((SECONDS - started)) s" >&2
        grep -E '^(FAILED|ERROR) ' "$log" >&2 || tail -n 20 "$log" >&2
    fi
done

echo "$passed passed runs of $runs"
[[ $passed == "$runs" ]]
