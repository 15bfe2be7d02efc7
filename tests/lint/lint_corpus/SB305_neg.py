import os

os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
os.environ.setdefault("PYTHONHASHSEED", "0")

import torch


def child_env():
    return dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")


def show():
    os.environ["OMP_NUM_THREADS"] = "1"
    return os.environ.get("CUBLAS_WORKSPACE_CONFIG"), torch.zeros(1)
