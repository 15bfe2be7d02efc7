import torch


def restore(saved):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = saved["cudnn"]
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    # torch.backends.cuda.matmul.allow_tf32 = True
