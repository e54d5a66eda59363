#!/usr/bin/env bash
# Evidence from a real GPU node, into $OUT/real-gpu.tar.gz: nvidia-smi -q (text and XML), gpumeter doctor
# (text and JSON), the board's NVML answers and every field id (probe.py), the exporter's /metrics idle,
# under load and after (native and dcgm naming), what each NVML call cost, and the exporter served as a
# user runs it (serve.py). Run from the repo root on the GPU node, with gpumeter and the runtime wheels it
# needs in .whl/ (no registry is reachable there): docs/real-gpu.md.
. tests/real_gpu/node.sh real-gpu
cd /  # the repo root's gpumeter/ folder would shadow the installed package
uname -a > "$D/uname.txt"
nvidia-smi > "$D/nvidia-smi.txt" 2>&1
nvidia-smi -q > "$D/nvidia-smi-q.txt" 2>&1
nvidia-smi -q -x > "$D/nvidia-smi-q.xml" 2>&1
python3 -m gpumeter doctor --json > "$D/doctor.json" 2> "$D/doctor.err"; echo "doctor --json: exit $?"
python3 -m gpumeter doctor > "$D/doctor.txt" 2>&1; echo "doctor: exit $?"
python3 -m gpumeter exporter --naming dcgm --listen 127.0.0.1:9400 --interval 1 --kubelet-socket '' \
  > "$D/exporter-dcgm.log" 2>&1 &
dcgm=$!
timeout 150 python3 "$REPO/tests/real_gpu/probe.py" "$D" > "$D/probe.log" 2>&1; echo "probe: exit $?"
kill -INT $dcgm; sleep 3; kill -0 $dcgm 2>/dev/null && echo "dcgm-naming exporter still running 3 s after SIGINT"
timeout 120 python3 "$REPO/tests/real_gpu/serve.py" "$D" 60 > "$D/serve.log" 2>&1; echo "serve: exit $?"
nvidia-smi -q > "$D/nvidia-smi-q-after.txt" 2>&1
for f in probe.log doctor.err exporter-dcgm.log serve.log; do echo "== $f"; tail -n 8 "$D/$f"; done
ls -la "$D"
tar czf "$OUT/real-gpu.tar.gz" -C "$OUT" real-gpu && rm -rf "$D"
