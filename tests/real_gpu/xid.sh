#!/usr/bin/env bash
# Application faults on a real GPU node, into $OUT/real-gpu-xid.tar.gz: nvidia-smi -q before and after, the
# kernel log's Xid lines, and what the exporter (native and dcgm naming) exported for each fault (xid.py).
# Run from the repo root on the GPU node, with gpumeter and its runtime wheels in .whl/ (docs/real-gpu.md).
. tests/real_gpu/node.sh real-gpu-xid
cd /  # the repo root's gpumeter/ folder would shadow the installed package
nvidia-smi -q > "$D/nvidia-smi-q-before-faults.txt" 2>&1
timeout 400 python3 "$REPO/tests/real_gpu/xid.py" "$D" > "$D/xid.log" 2>&1; echo "xid.py: exit $?"
nvidia-smi -q > "$D/nvidia-smi-q-after-faults.txt" 2>&1
nvidia-smi > "$D/nvidia-smi-after-faults.txt" 2>&1
python3 -m gpumeter doctor --json > "$D/doctor-after-faults.json" 2> "$D/doctor.err"; echo "doctor --json after: exit $?"
tail -n 60 "$D/xid.log"
ls -la "$D"
tar czf "$OUT/real-gpu-xid.tar.gz" -C "$OUT" real-gpu-xid && rm -rf "$D"
