import os

import torch

os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # expect: SB305


def setup():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # expect: SB305
    os.environ.update({"CUBLAS_WORKSPACE_CONFIG": ":16:8"})  # expect: SB305
    os.putenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # expect: SB305
    return torch.zeros(1)
