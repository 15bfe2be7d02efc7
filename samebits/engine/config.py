"""Engine configuration: one frozen, validated value the engine and every test can build from a dict."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from samebits.dtypes import check_quantization, normalize_dtype
from samebits.engine.seeds import check_seed
from samebits.engine.spec_decode.config import SpeculativeConfig
from samebits.errors import require
from samebits.modes import TP_SIZES, check_mode

POLICIES = ("dynamic", "bucketed")
# The row-parallel sum across ranks (samebits/distributed/reduce.py, docs/TP.md): ordered (fixed tree in rank order),
# native (the library's), invariant (TP-invariant mode: TP_MAX K-chunks at every size, one fixed tree).
ALL_REDUCE_ROUTES = ("ordered", "native", "invariant")
# Tokens per KV page where block_size is None, by device type; other devices take vLLM's 16, which shares prefixes
# more finely. On CUDA a page of the attention's KV tile (64 tokens, kernels/configs.py attention.kv_tile) holds
# whole tiles, so the kernel loads one block id per tile instead of gathering key by key: decode 1.05-1.36x and
# prefill 1.2x faster on the H200 than 16-token pages (docs/results/HISTORY.md §3). The bits never depend on it.
BLOCK_SIZES = {"cuda": 64}
OTHER_BLOCK_SIZE = 16
# Where data-parallel replicas run (samebits/fleet, docs/FLEET.md): Ray actors. vLLM's other backend, "mp", is not
# offered: Ray already places, restarts and reaches replicas on one host or many.
DATA_PARALLEL_BACKENDS = ("ray",)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_at_least(name: str, value, low: int, optional: bool = False) -> None:
    if optional and value is None:
        return
    prefix = "None or " if optional else ""
    require(_is_int(value) and value >= low, name, f"{name} must be {prefix}an int >= {low}, got {value!r}")


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m"
    mode: str = "deterministic"
    policy: str = "dynamic"
    device: str | None = None
    dtype: str | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    # Prefill fairness under policy "dynamic" (engine/scheduler/prefills.py), vLLM's names: while others wait that
    # could use the rest, one prefill chunk takes at most long_prefill_token_threshold tokens of a step (None: half
    # the budget; 0: no cap), and at most max_num_partial_prefills prefills span steps at once, max_long_partial_prefills of them longer
    # than the threshold. Which rows run together only: the bits never depend on them.
    long_prefill_token_threshold: int | None = None
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    max_model_len: int | None = None
    block_size: int | None = None  # tokens per KV page; None: the device's (BLOCK_SIZES)
    kv_cache_tokens: int | None = None
    # vLLM's: the share of the GPU's whole memory this engine may hold (weights, activations, KV cache), so several
    # engines share one GPU (engine/model_runner.py choose_num_blocks). None: the KV cache takes a share of the free
    # memory. Ignored on the CPU, whose KV cache is a fixed size (model_runner.CPU_KV_TOKENS) unless kv_cache_tokens.
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool = True
    cuda_graphs: bool = True
    # vLLM's name for cuda_graphs=False; the two spellings are normalised to agree (either asks for eager: eager).
    enforce_eager: bool = False
    # Schedule and launch step N+1 before step N's draws are read back (engine/llm_engine.py). None: on where the
    # device computes asynchronously (CUDA, one rank), off on the CPU, where the host computes the step itself.
    async_scheduling: bool | None = None
    seed: int | None = None
    max_waiting: int | None = None
    tensor_parallel_size: int = 1
    all_reduce: str = "ordered"
    # Engine replicas behind one front end (samebits/fleet): each a whole engine, so the bits never depend on it.
    data_parallel_size: int = 1
    data_parallel_backend: str | None = None  # None: "ray" when data_parallel_size > 1
    ray_address: str | None = None  # a running cluster (`ray start --head`) to join; None: a local one
    quantization: str | None = None  # samebits.dtypes QUANTIZATIONS; None: the checkpoint's own (dense or FP8)
    # vLLM's speculative_config (a dict, its JSON, or a SpeculativeConfig): draft tokens verified in one forward,
    # whose outputs are plain decoding's bits (engine/spec_decode/, docs/SPECULATIVE.md). None: off.
    speculative_config: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        # Normalised in place so equal configs compare (and fingerprint) equal whatever spelling was used.
        object.__setattr__(self, "dtype", normalize_dtype(self.dtype))
        object.__setattr__(self, "device", None if self.device is None else str(self.device))
        object.__setattr__(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))
        self._check_choices()
        self._check_sizes()
        self._check_flags()
        eager = self.enforce_eager or not self.cuda_graphs
        object.__setattr__(self, "enforce_eager", eager)
        object.__setattr__(self, "cuda_graphs", not eager)
        self._check_speculation()

    def _check_choices(self) -> None:
        require(isinstance(self.model, str) and self.model != "", "model",
                f"model must be a non-empty str, got {self.model!r}")
        check_mode(self.mode)
        check_quantization(self.quantization)
        require(self.policy in POLICIES, "policy", f"policy must be one of {POLICIES}, got {self.policy!r}")
        require(self.tensor_parallel_size in TP_SIZES and _is_int(self.tensor_parallel_size), "tensor_parallel_size",
                f"tensor_parallel_size must be one of {TP_SIZES}, got {self.tensor_parallel_size!r}")
        require(self.all_reduce in ALL_REDUCE_ROUTES, "all_reduce",
                f"all_reduce must be one of {ALL_REDUCE_ROUTES}, got {self.all_reduce!r}")
        backend = self.data_parallel_backend
        require(backend is None or backend in DATA_PARALLEL_BACKENDS, "data_parallel_backend",
                f"data_parallel_backend must be None or one of {DATA_PARALLEL_BACKENDS}, got {backend!r}")
        address = self.ray_address
        require(address is None or (isinstance(address, str) and address != ""), "ray_address",
                f"ray_address must be None or a non-empty str, got {address!r}")
        check_seed(self.seed)

    def _check_sizes(self) -> None:
        _int_at_least("max_num_seqs", self.max_num_seqs, 1)
        _int_at_least("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        _int_at_least("long_prefill_token_threshold", self.long_prefill_token_threshold, 0, optional=True)
        _int_at_least("max_num_partial_prefills", self.max_num_partial_prefills, 1)
        _int_at_least("max_long_partial_prefills", self.max_long_partial_prefills, 1)
        require(self.max_long_partial_prefills <= self.max_num_partial_prefills, "max_long_partial_prefills",
                f"max_long_partial_prefills must be <= max_num_partial_prefills={self.max_num_partial_prefills}, got "
                f"{self.max_long_partial_prefills}")
        _int_at_least("max_model_len", self.max_model_len, 2, optional=True)
        _int_at_least("max_waiting", self.max_waiting, 1, optional=True)
        _int_at_least("data_parallel_size", self.data_parallel_size, 1)
        # A replica of several ranks would need its GPUs placed as one group (docs/FLEET.md); not yet.
        require(self.data_parallel_size == 1 or self.tensor_parallel_size == 1, "data_parallel_size",
                f"data_parallel_size > 1 needs tensor_parallel_size=1, got {self.tensor_parallel_size}")
        bs = self.block_size
        # Paged-attention kernels tile a block with power-of-two loads.
        require(bs is None or (_is_int(bs) and 1 <= bs <= 1024 and bs & (bs - 1) == 0), "block_size",
                f"block_size must be None or a power of two in [1, 1024], got {bs!r}")
        _int_at_least("kv_cache_tokens", self.kv_cache_tokens, bs or 1, optional=True)
        util = self.gpu_memory_utilization
        require(util is None or (isinstance(util, (int, float)) and not isinstance(util, bool) and 0 < util <= 1),
                "gpu_memory_utilization", f"gpu_memory_utilization must be None or a number in (0, 1], got {util!r}")
        if self.policy == "bucketed":
            # Bucketed decode pads the batch up to max_num_seqs rows, and every padded row costs a budget token.
            require(self.max_num_batched_tokens >= self.max_num_seqs, "max_num_batched_tokens",
                    "max_num_batched_tokens must be >= max_num_seqs under policy='bucketed', got "
                    f"{self.max_num_batched_tokens} < {self.max_num_seqs}")

    def _check_flags(self) -> None:
        for name in ("enable_prefix_caching", "cuda_graphs", "enforce_eager"):
            value = getattr(self, name)
            require(isinstance(value, bool), name, f"{name} must be a bool, got {value!r}")
        value = self.async_scheduling
        require(value is None or isinstance(value, bool), "async_scheduling",
                f"async_scheduling must be None or a bool, got {value!r}")
        # The tensor-parallel runner reads every input from the host (samebits/engine/tp_runner.py).
        require(value is not True or self.tensor_parallel_size == 1, "async_scheduling",
                f"async_scheduling=True needs tensor_parallel_size=1, got {self.tensor_parallel_size}")
        # Fast kernels keep no order for the invariant split to preserve.
        require(self.all_reduce != "invariant" or self.mode == "deterministic", "all_reduce",
                f"all_reduce='invariant' needs mode='deterministic', got {self.mode!r}")

    def _check_speculation(self) -> None:
        if self.speculative_config is None:
            return
        # A bucketed step's shape is fixed by its policy; a verify chunk has 1 + k rows.
        require(self.policy == "dynamic", "speculative_config",
                f"speculative_config needs policy='dynamic', got {self.policy!r}")
        require(self.tensor_parallel_size == 1, "speculative_config",
                f"speculative_config needs tensor_parallel_size=1, got {self.tensor_parallel_size}")

    @classmethod
    def from_dict(cls, values: dict) -> EngineConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown EngineConfig keys {unknown}; valid keys are {sorted(known)}")
        return cls(**values)

    @property
    def tp_invariant(self) -> bool:
        return self.all_reduce == "invariant"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def replace(self, **changes) -> EngineConfig:
        return EngineConfig.from_dict({**self.to_dict(), **changes})

    def on_device(self, device_type: str) -> EngineConfig:
        """This config as an engine on `device_type` runs it: block_size None becomes the device's page size."""
        if self.block_size is not None:
            return self
        return self.replace(block_size=BLOCK_SIZES.get(device_type, OTHER_BLOCK_SIZE))
