#!/usr/bin/env bash
# Fill the ignored .snap/ for the next device session's calls (docs/PERFORMANCE.md, "What the next
# device session runs"), on this machine, from HEAD: a new checkout has none of it.
#   bash scripts/calls/prepare.sh          (about 2 minutes: two library builds, the probe)
# Then, on the box (carry [".whl", ".snap"]; .whl from ../shared/gpu/wheelhouse.sh):
#   bash scripts/calls/any.sh              an H200: item 0; another Hopper: scripts/calls/h100.sh
# What it writes:
#   .snap/code_main.tar.gz, .snap/sha      HEAD's code folders (`git archive`) and its short sha
#   .snap/code_row.tar.gz, .snap/sha_row   the same with docs/data/h200_small_launch_row.patch, as a
#                                          commit on branch h200-small (made here when missing or
#                                          not on HEAD)
#   .snap/lib.tar.xz, .snap/lib_key        the tree's default library (xz: a carry is 64 MiB in all)
#   .snap/coop2.tar.xz, .snap/coop2_key    the FOSCAR_COOP_MERGE=1 build (item 1)
#   .snap/probe_icache.xz                  scripts/probe_icache.cu built for sm_90a
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .snap
grep -qx '/.snap/' .git/info/exclude 2>/dev/null || echo '/.snap/' >> .git/info/exclude
export FOSCAR_CACHE_DIR=$PWD/.foscar-cache PYTHONPATH=.
folders=(suite baselines foscar core scripts tests reports pyproject.toml)
git archive --format=tar.gz HEAD -- "${folders[@]}" > .snap/code_main.tar.gz
git rev-parse --short HEAD > .snap/sha
# The H200 small-launch row as a commit on HEAD (branch h200-small), rebuilt when HEAD moved.
if [[ $(git rev-parse -q --verify h200-small^ 2>/dev/null) != $(git rev-parse HEAD) ]]; then
    W=$(mktemp -d); git worktree add -q --detach "$W" HEAD
    (cd "$W" && git apply docs/data/h200_small_launch_row.patch && git commit -qam \
        "H200 small-launch row: (16 rows, 2 CTAs an SM) in kernels.SMALL_LAUNCH_CTAS, for item 0's grid" \
        && git branch -f h200-small HEAD)
    git worktree remove --force "$W"
fi
git archive --format=tar.gz h200-small -- "${folders[@]}" > .snap/code_row.tar.gz
git rev-parse --short h200-small > .snap/sha_row
pack() {  # pack KEY_FILE TARBALL DEFINES...: build, drop the objects, xz the library's folder
    local keyfile=$1 tarball=$2; shift 2
    local key
    key=$(python3 -c "import sys; from foscar.build import build; print(build('sm_90a', defines=tuple(sys.argv[1:])).key)" "$@" | tail -1)
    find ".foscar-cache/sm_90a-$key" -name '*.o' -delete
    tar -cJf "$tarball" ".foscar-cache/sm_90a-$key"
    echo "$key" > "$keyfile"
    echo "$tarball: library $key"
}
pack .snap/lib_key .snap/lib.tar.xz
pack .snap/coop2_key .snap/coop2.tar.xz -DFOSCAR_COOP_MERGE=1
nvcc -arch=sm_90a -O3 -o .snap/probe_icache scripts/probe_icache.cu && xz -f -9 .snap/probe_icache
du -sb .snap .whl 2>/dev/null | awk '{s += $1} END {printf "carried beside the tracked files: %.1f MB\n", s / 1e6}'
