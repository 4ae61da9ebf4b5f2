"""Float32 values and what torch's .to(torch.float16) and .to(torch.bfloat16) make of them, for the
unit test of ucp's own conversions: special values, both sides of every rounding boundary that
matters (fp16 overflow, subnormals, ties to even), and random bit patterns across all exponents.

  make_rounding_cases.py OUT_DIR   -> OUT_DIR/rounding.pt {'fp32', 'fp16', 'bf16'}
"""
import os
import sys

import torch

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
special = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.996, 65520.0, -65520.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25,
           3 * 2.0 ** -25, 2.0 ** -26, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8,
           3.3895313892515355e38, 1e-45, 1.1754943508222875e-38, float("inf"), float("-inf"), float("nan")]
g = torch.Generator().manual_seed(7)
bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (200000,), generator=g, dtype=torch.int64).to(torch.int32)
x = torch.cat([torch.tensor(special, dtype=torch.float32), bits.view(torch.float32)])
torch.save({"fp32": x, "fp16": x.to(torch.float16), "bf16": x.to(torch.bfloat16)}, os.path.join(out, "rounding.pt"))
print(f"{x.numel()} values")
