"""A steady GPU load for the probe: bf16 matrix products for N seconds (PyTorch, on the GPU node)."""

import sys
import time

import torch

seconds = float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
keep = torch.empty(20 * 1024**3, dtype=torch.uint8, device="cuda")  # 20 GiB held: memory used moves
end = time.time() + seconds
while time.time() < end:
    for _ in range(50):
        a @ b
    torch.cuda.synchronize()
print("load done", flush=True)
