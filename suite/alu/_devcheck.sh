#!/bin/bash
# Temporary: per-pipe counters and per-instruction counts for the zoo (removed before commit).
P=$(ncu --query-metrics --chip gh100 | awk '{print $1}' | grep -E '^smsp__(inst_executed_pipe_[a-z0-9_]+|thread_inst_executed_pipe_[a-z0-9_]+_pred_on|inst_executed|thread_inst_executed|thread_inst_executed_pred_on|sass_thread_inst_executed_op_[a-z0-9_]+_pred_on)$' | sed 's/$/.sum/' | paste -sd,)
nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/zoo tests/suite/data/alu_zoo.cu || exit 1
nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/probe tests/suite/data/alu_probe.cu || exit 1
cuobjdump -sass /tmp/zoo > $OUT/zoo_sass.txt; cuobjdump -sass /tmp/probe > $OUT/probe_sass.txt
for b in zoo probe; do
  timeout 250 ncu --clock-control none --metrics "$P" --csv --page raw --print-units base /tmp/$b > $OUT/${b}_raw.csv 2> $OUT/${b}_raw.err
  timeout 250 ncu --clock-control none --section SourceCounters --csv --page source --print-source sass /tmp/$b > $OUT/${b}_source.csv 2>&1
done
cat $OUT/*.err; rm $OUT/*.err; ls -la $OUT; wc -l $OUT/*
