"""samebits.models: Llama-family transformers on the kernel registry, loaded from HF safetensors or GGUF."""
from samebits.models.config import ModelConfig, UnsupportedModelError
from samebits.models.llama import LlamaModel
from samebits.models.loader import LoadedModel, load_model
from samebits.models.tokenizer import Tokenizer

__all__ = ["LlamaModel", "LoadedModel", "ModelConfig", "Tokenizer", "UnsupportedModelError", "load_model"]
