# Sourced by item0.sh and h100.sh: what both calls do with prepare.sh's .snap/ (run from the tree's root).
ROOT=$PWD
# A call without .snap/ stops at once and says what to run.
require_snap() {
    [[ -s .snap/lib_key && -s .snap/sha ]] || {
        echo "$0: .snap/ has no library key or sha: run scripts/calls/prepare.sh on the CPU machine and carry .snap"; exit 2; }
}
# The hot instruction cache's size (scripts/probe_icache.cu capacity, about 10 s) into file $1.
icache_probe() {
    xz -dc "$ROOT/.snap/probe_icache.xz" > /tmp/probe_icache && chmod +x /tmp/probe_icache && \
        timeout 60 /tmp/probe_icache capacity > "$1"; echo "== icache probe rc $?"
}
# HEAD's tree as .snap holds it, in a fresh folder (files edited here during the call do not
# travel), with .whl and .snap linked and the named .snap tarballs (libraries) unpacked; cd there.
unpack_main() {
    local d t
    d=$(mktemp -d)
    tar -xzf "$ROOT/.snap/code_main.tar.gz" -C "$d" && ln -s "$ROOT/.whl" "$d/.whl" && ln -s "$ROOT/.snap" "$d/.snap" \
        && cd "$d" || exit 2
    for t in "$@"; do tar -xJf "$ROOT/.snap/$t" || exit 2; done
}
