import torch

torch.backends.cuda.matmul.allow_tf32 = True  # expect: SB303
torch.backends.cudnn.allow_tf32 = True  # expect: SB303
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True  # expect: SB303
torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = True  # expect: SB303
torch.set_float32_matmul_precision("high")  # expect: SB303
torch.backends.cuda.matmul.fp32_precision = "tf32"  # expect: SB303
