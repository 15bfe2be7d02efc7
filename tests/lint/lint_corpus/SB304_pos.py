import torch


def main():
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.allow_tf32 = False


if __name__ == "__main__":  # expect: SB304
    main()
