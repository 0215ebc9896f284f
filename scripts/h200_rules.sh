#!/usr/bin/env bash
# A planner rule by GPU (foscar.kernels' tables) judged in one device call: the lab's forced split
# counts at the shapes the rule would move, then the harness (h200_record.sh) on this tree, and,
# where ROW_TREE names a `git archive` tarball of the commit that adds the rule, on that tree too
# (into $OUT/row): the same library under both rules, back to back on one card.
#   LIB=.foscar-cache/sm_90a-<key>/libfoscar.so FOSCAR_GIT_SHA=<this commit> \
#     ROW_TREE=.snap/code_row.tar.gz ROW_SHA=<its commit> bash scripts/h200_rules.sh
# LAB: "batch kv_len splits instances" per shape, ';'-separated (kernel_lab.py --splits and
# --instances; configs CONFIGS, two rounds). The default is the H200 small-launch row's shapes
# (docs/PERFORMANCE.md, "What the next device session runs", item 0): batch 1 at 8K and 16K and
# batch 2 at 4K and 8K on the kernel's own instance at the plan's count and the two-CTA plan's,
# and batch 1 / 32K, where the four-CTA instance runs either way.
# GPU (default H200): the card the rule is for; another card exits 3 before any work.
# STAGES=none: the lab alone, without the harness on either tree (a rule's first look on a card,
# e.g. GPU=H100 CONFIGS=4ct with forced split counts; docs/PERFORMANCE.md, thirty-second session).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/limit.sh"  # limit_failures: the lab shapes cut off or failing
export PYTHONUNBUFFERED=1 PYTHONPATH=. FOSCAR_CACHE_DIR=${FOSCAR_CACHE_DIR:-$PWD/.foscar-cache}
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
W=$(mktemp -d)
CARD=$(nvidia-smi --query-gpu=name,uuid --format=csv,noheader 2>/dev/null | head -1)
echo "== $CARD"
[[ $CARD == *"${GPU:-H200}"* ]] || { echo "== not a ${GPU:-H200}: $CARD"; exit 3; }
: "${LIB:?LIB: the library the lab times (.foscar-cache/sm_90a-<key>/libfoscar.so)}"
LAB=${LAB:-"1 8192 plan,32 own;1 16384 plan,32 own;2 4096 plan,16 own;2 8192 plan,16 own;1 32768 plan,32 planner,own"}
BACKENDS_PAPER=${BACKENDS_PAPER:-foscar-int4,foscar-int2,flashinfer-bf16-tc,trtllm-xqa-fp8}
STAGES=${STAGES:-tests grid paper floor targets}
IFS=';' read -ra shapes <<< "$LAB"
for i in "${!shapes[@]}"; do  # each shape through h200_shapes.sh (its log with the clocks), with its own LAB_ARGS
    read -r b kv splits inst <<< "${shapes[$i]}"
    SHAPES="$b $kv ${CONFIGS:-4ct,2ct} 2" TAG="rules$i" OUT="$W" \
        LAB_ARGS="--prebuilt rule=$LIB --instances ${inst:-own} --splits $splits" bash scripts/h200_shapes.sh
    tar -C "$W" -czf "$OUT/rules_lab.tar.gz" .  # after each shape: a call cut off keeps the shapes done
done
n=$(limit_failures <(cat "$W"/rules*.log))
rc=0
if [[ $STAGES != none ]]; then
    STAGES="$STAGES" BACKENDS_PAPER="$BACKENDS_PAPER" OUT="$OUT" bash scripts/h200_record.sh 2>&1 | tail -60
    rc=$?
    rm -rf "$OUT/record"  # in record.tar.gz: a call brings back at most 8 files
    if [[ -n ${ROW_TREE:-} ]]; then  # the other commit's tree, timed the same way (no kernel tests: same library)
        R=$(mktemp -d); tar -xzf "$ROW_TREE" -C "$R" && [[ -d .whl ]] && ln -s "$PWD/.whl" "$R/.whl"
        (cd "$R" && STAGES="${ROW_STAGES:-grid paper floor targets}" BACKENDS_PAPER="$BACKENDS_PAPER" OUT="$OUT/row" \
            FOSCAR_GIT_SHA="${ROW_SHA:?ROW_SHA: the commit ROW_TREE holds}" bash scripts/h200_record.sh 2>&1 | tail -60)
        rc=$(( rc || $? )); rm -rf "$OUT/row/record"
    fi
fi
(( n == 0 )) || echo "== $n lab shape(s) timed out or failed"
exit $(( rc || n > 0 ))
