#!/usr/bin/env bash
# Test the package as users install it: build the sdist and the wheel, check their
# metadata, install the wheel (not editable) into a fresh virtualenv, build the native
# harness from the installed package, and run the test suite from a copy of the
# repository that has no pytest_backends/ or native/ in it, so every import resolves
# to site-packages.
#
#   scripts/test-installed.sh [wheel|full|min|latest] [pytest args...]
#
#   wheel   what `make test INSTALL=wheel` (CI) runs: torch $TORCH, the newest pytest, the
#           slow end-to-end group (`-m slow`, which `make test` leaves out) and the
#           packaging tests, then the sdist and the demo
#   full    torch $TORCH (default torch==2.13.0) and the newest pytest: the whole suite
#   min     the declared floor (pytest, pluggy, pytest-xdist, hypothesis): the hooks,
#           the leak guard, --backends-verify, packaging and the idle-import promise,
#           every inner session in a new interpreter (no forks of tests/zygote.py)
#   latest  the newest torch pip allows here ($TORCH_LATEST, a CUDA build): the flag
#           registry, leak guard, plugin and packaging tests
#
# Environments live in .whl/ (ignored by git); each run starts them afresh, as copies of a
# virtualenv that holds torch alone (made once per torch requirement). The suite
# runs from a copy of the tree, so the pytest arguments' paths are resolved against the
# caller's directory first: a test path of the checkout names the copy's file, an
# output file (--junitxml=out.xml) lands where the caller asked.
set -euo pipefail
caller=$PWD
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
flavor=${1:-full}
[ $# -gt 0 ] && shift
PYTHON=${PYTHON:-python3}
TORCH=${TORCH:-torch==2.13.0}
TORCH_LATEST=${TORCH_LATEST:-torch==2.14.1}
# The floor the metadata admits (pyproject.toml), pinned exactly.
MIN_PINS=("pytest==8.0.0" "pluggy==1.3.0" "pytest-xdist==3.3.0" "hypothesis==6.80.0")
PIP=(pip install -q --disable-pip-version-check)
work=$root/.whl
dist=$work/dist
start=$SECONDS
say() { printf '\n== %s (%ds)\n' "$*" "$((SECONDS - start))"; }

# The tree's tracked and unignored files, hashed: a second flavor in the same run (CI runs
# three) reuses the sdist and the wheel built from the same files.
tree=$(git ls-files -z --cached --others --exclude-standard 2>/dev/null \
       | xargs -0 sha256sum 2>/dev/null | sha256sum | cut -c1-64 || true)
if git rev-parse --git-dir >/dev/null 2>&1 && [ -n "$tree" ] \
        && [ "$(cat "$dist/.tree" 2>/dev/null)" = "$tree" ] \
        && [ "$(ls "$dist"/*.whl 2>/dev/null | wc -l)" = 1 ] \
        && [ "$(ls "$dist"/*.tar.gz 2>/dev/null | wc -l)" = 1 ]; then
    say "the sdist and the wheel built from these files already, in $dist: reused"
else
say "building the sdist and the wheel from a clean export of the tree"
rm -rf "$dist" "$work/src"
mkdir -p "$dist" "$work/src"
# git archive of the working tree's tracked files (a stale build/ cannot leak in);
# outside a git checkout (an unpacked sdist) the tree is copied as it is.
if git rev-parse --git-dir >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard | \
        (cd "$root" && xargs -0 cp --parents -t "$work/src" 2>/dev/null || true)
else
    cp -r pyproject.toml setup.py README.md LICENSE CHANGELOG.md pytest_backends native "$work/src"/
fi
"$PYTHON" -m venv "$work/build-venv"
"$work/build-venv/bin/python" -m "${PIP[@]}" build twine
"$work/build-venv/bin/python" -m build -q --outdir "$dist" "$work/src" >/dev/null
"$work/build-venv/bin/python" -m twine check --strict "$dist"/*
[ -n "$tree" ] && printf '%s\n' "$tree" > "$dist/.tree"
fi
wheel=$(ls "$dist"/*.whl)
sdist=$(ls "$dist"/*.tar.gz)

case $flavor in
    full|wheel) torch=$TORCH; pins=() ;;
    min) torch=$TORCH; pins=("${MIN_PINS[@]}") ;;
    latest) torch=$TORCH_LATEST; pins=() ;;
    *) echo "unknown flavor $flavor (full, min, latest)"; exit 2 ;;
esac

venv=$work/venv-$flavor
# The same check in every flavor (the wheel with its own requirements, no torch): made in the
# flavors that test the wheel itself, which CI runs first.
if [ "$flavor" = wheel ] || [ "$flavor" = full ]; then
say "fresh virtualenv $venv-idle with the wheel alone (no torch)"
rm -rf "$venv-idle"
"$PYTHON" -m venv "$venv-idle"
"$venv-idle/bin/python" -m "${PIP[@]}" "$wheel"
# A suite that never uses torch runs with the plugin loaded and torch absent.
idle=$(mktemp -d)
printf 'def test_plain():\n    assert 1 + 1 == 2\n' > "$idle/test_idle.py"
(cd "$idle" && "$venv-idle/bin/python" -m pytest -q -p no:cacheprovider test_idle.py)
help=$(cd "$idle" && "$venv-idle/bin/python" -m pytest --help)
grep -q -- "--backends-matrix" <<<"$help" || { echo "the installed plugin did not load"; exit 1; }
rm -rf "$idle" "$venv-idle"
fi

fresh_venv() {  # fresh_venv DIR TORCH: a virtualenv at DIR holding TORCH alone
    PYTHON=$PYTHON "$root/scripts/torch-venv.sh" "$1" "$2"
}

say "fresh virtualenv $venv: $torch, the wheel and the test requirements ${pins[*]:-}"
fresh_venv "$venv" "$torch"
"$venv/bin/python" -m "${PIP[@]}" "${wheel}[test]" "$torch" "${pins[@]}"
"$venv/bin/python" -m pip list --disable-pip-version-check 2>/dev/null \
    | grep -Ei '^(torch|pytest|pluggy|pytest-xdist|hypothesis|pytest-backends) '

say "building the native harness from the installed package"
(cd "$work" && "$venv/bin/python" -m pytest_backends build-native) \
    || echo "no native harness: the tests use the pure-Python fallback"

say "copying the tests out of the source tree"
suite=$work/suite-$flavor
rm -rf "$suite"
cp -r "$work/src" "$suite"
rm -rf "$suite/pytest_backends" "$suite/native" "$suite/setup.py"

# Options whose value is a path, for the resolution below.
PATH_OPTIONS=" --junitxml --junit-xml --basetemp --confcutdir --rootdir -c --backends-report \
--backends-html --backends-census --backends-baseline "
absolute() { case $1 in /*) printf '%s' "$1" ;; *) printf '%s' "$caller/$1" ;; esac; }
args=()
want_path=
for arg in "$@"; do
    if [ -n "$want_path" ]; then
        args+=("$(absolute "$arg")"); want_path=; continue
    fi
    case $arg in
        -*=*) opt=${arg%%=*}
              if [[ $PATH_OPTIONS == *" $opt "* ]]; then
                  args+=("$opt=$(absolute "${arg#*=}")")
              else args+=("$arg"); fi ;;
        -*) args+=("$arg"); [[ $PATH_OPTIONS == *" $arg "* ]] && want_path=1 ;;
        *) path=$(absolute "$arg")
           if [ -e "${path%%::*}" ] && [[ $(realpath -m "$path") == "$root"/* ]]; then
               rel=$(realpath -m "$path"); args+=("${rel#"$root"/}")  # the copy's own file
           else args+=("$arg"); fi ;;
    esac
done

case $flavor in
    full|wheel) paths=() ;;
    min) paths=(tests/packaging tests/plugin tests/matrix/test_import_cost.py
                tests/matrix/test_verify_e2e.py tests/matrix/test_markers.py
                tests/unit/test_tracked_state.py tests/capability/test_scheduler.py) ;;
    # what reads or sets torch's switches, builds against torch, or packages: the rest
    # of tests/plugin (options, reports, import order) does not depend on torch's version
    # (the import graph is our modules' own, whatever the torch, and the tests' own fork
    # server is tested with the pinned torch in `make test`)
    latest) paths=(tests/packaging tests/unit --ignore=tests/unit/test_import_graph.py
                   --ignore=tests/unit/test_zygote.py
                   tests/plugin/test_leak_guard.py
                   tests/plugin/test_leak_guard_trust.py tests/plugin/test_leak_rows.py
                   tests/plugin/test_adversary.py tests/plugin/test_leak_guard_budget.py
                   tests/plugin/test_idle_session.py tests/plugin/test_cli.py
                   tests/native/test_digest.py tests/determinism/test_reproducible_api.py
                   tests/matrix/test_matrix_e2e.py -m "not slow") ;;
esac
say "running the suite against the installed package ($flavor)"
cd "$suite"
# The min flavor's tests are mostly about the leak guard, whose behaviour depends on when
# torch is imported: their sessions start new interpreters, never forks of one that
# imported torch already (tests/zygote.py).
fork=1
[ "$flavor" = min ] && fork=0
suite_run() {
    PYTEST_BACKENDS_SOURCE_TREE=$root PYTEST_BACKENDS_EXPECT_INSTALLED=1 \
    PYTEST_BACKENDS_TESTS_FORK=$fork "$venv/bin/python" -m pytest -n 2 -q -p no:cacheprovider "$@"
}
if [ "$flavor" = wheel ]; then
    suite_run -m slow "${args[@]}"
    say "the packaging tests against the installed package"
    suite_run tests/packaging -m "not slow" "${args[@]}"
else
    suite_run "${paths[@]}" "${args[@]}"
fi
if [ "$flavor" = full ] || [ "$flavor" = wheel ]; then
    say "the sdist installs and its plugin runs a user suite"
    cd "$root"
    sd=$work/venv-sdist
    fresh_venv "$sd" "$torch"
    "$sd/bin/python" -m "${PIP[@]}" "$sdist" "$torch"
    # the demo, copied out of the repository, checks its own outcomes
    user=$(mktemp -d)
    cp -r "$root/demo" "$user/demo"
    (cd "$user" && "$sd/bin/python" demo/run_demo.py "$user/out" > "$user/log" 2>&1) \
        || { tail -40 "$user/log"; exit 1; }
    tail -3 "$user/log"
    rm -rf "$user"
fi
say "done"
