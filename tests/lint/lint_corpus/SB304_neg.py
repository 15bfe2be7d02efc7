import torch

FLAGS = {"cudnn": False, "bf16": False}


def main():
    torch.use_deterministic_algorithms(mode=True)
    torch.backends.cudnn.allow_tf32 = FLAGS["cudnn"]
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = FLAGS["bf16"]


if __name__ == "__main__":
    main()
