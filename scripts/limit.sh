# Sourced by the device scripts: `limit SECONDS COMMAND...` is `timeout`, but a command cut off
# or failing says so, as the last line of its output (which the stage's tail then keeps in the
# log), instead of looking like a stage done; `limit_failures LOG` counts those lines.
limit() {
    local s=$1 rc; shift
    timeout "$s" "$@"; rc=$?
    if (( rc == 124 || rc == 137 )); then
        echo "== TIMED OUT after ${s} s (rc $rc): $*" >&2
    elif (( rc )); then
        echo "== FAILED (rc $rc): $*" >&2
    fi
    return "$rc"
}
limit_failures() { grep -cE '^== (TIMED OUT|FAILED)' "$1"; }
