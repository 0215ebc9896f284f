#!/usr/bin/env bash
# kernel_lab.py over several shapes in one device call: SHAPES is a list of
# "batch kv_len configs rounds [group]"; LAB_ARGS the variants (--variant / --prebuilt), the same
# for every shape; each shape's rows go to $OUT/lab_<tag>_b<batch>_kv<len>[_g<group>].json (more than
# six of them packed into $OUT/lab_<tag>.tar.gz, since a call brings back at most 8 files).
#   SHAPES="1 131072 4ct,2ct 2;1 4096 4ct 2 64" TAG=c4 \
#     LAB_ARGS="--prebuilt v31=... --prebuilt c4=..." bash scripts/h200_shapes.sh
# Timelines are scripts/h200_lab.sh's (TIMELINE=, TIMELINE_SHAPES=, TIMING=0), in the same call.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/limit.sh"  # limit: timeout that says so in the log
export PYTHONUNBUFFERED=1 PYTHONPATH=. FOSCAR_CACHE_DIR=${FOSCAR_CACHE_DIR:-$PWD/.foscar-cache}
OUT=${OUT:-out}; TAG=${TAG:-lab}; mkdir -p "$OUT"; LOG=$OUT/$TAG.log
smi() { nvidia-smi --query-gpu=name,uuid,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active --format=csv,noheader; }
smi | tee "$LOG"
IFS=';' read -ra shapes <<< "${SHAPES:-}"
for shape in "${shapes[@]}"; do
    read -r b kv cfg rounds g <<< "$shape"
    limit 240 python3 scripts/kernel_lab.py ${LAB_ARGS:-} --batch "$b" --kv-len "$kv" --configs "$cfg" \
        --rounds "${rounds:-1}" ${g:+--group "$g"} --json "$OUT/lab_${TAG}_b${b}_kv${kv}${g:+_g$g}.json" 2>&1 \
        | grep -vE '^\{' | tee -a "$LOG"
done
smi | tee -a "$LOG"
# A device call brings back at most 8 files: past 6 JSONs, they travel as one tarball.
jsons=("$OUT"/lab_"${TAG}"_b*.json)
if (( ${#jsons[@]} > 6 )); then  # an unmatched glob leaves one element
    tar -C "$OUT" -czf "$OUT/lab_${TAG}.tar.gz" "${jsons[@]#"$OUT"/}" && rm -f "${jsons[@]}"
fi
n=$(limit_failures "$LOG"); (( n == 0 )) || { echo "== $n shape(s) timed out or failed" | tee -a "$LOG"; exit 1; }
