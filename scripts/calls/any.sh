#!/usr/bin/env bash
# The next device session's call, whatever card comes (carry [".whl", ".snap"]; .snap from
# scripts/calls/prepare.sh): an H200 runs item 0, another Hopper scripts/calls/h100.sh.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash scripts/calls/item0.sh; fi
exec bash scripts/calls/h100.sh
