"""The names a batch size, a split count, an SM count and a grid go by, shared by the Python and CUDA checkers."""
import re

# The rows of a GEMM, requests, tokens, sequences: anything that grows with the batch rather than with one request.
# Not `b` or `B`: they name a GEMM's second operand as often as a batch.
BATCH = re.compile(r"^(m|bs|batch\w*|num_?tokens|n_?tokens|ntokens|total_?tokens|num_?seqs|n_?seqs|seq_?count|"
                   r"num_?sequences|n_?rows|num_?rows|num_?reqs|num_?requests)$", re.IGNORECASE)
SPLIT = re.compile(r"split", re.IGNORECASE)
SM_NAME = re.compile(r"^(num_?sms?|n_?sms?|sm_?count|nsms?|multi_?processor_?count|get_?num_?sms|get_?sm_?count|"
                     r"get_?multi_?processor_?count|cudaDevAttrMultiProcessorCount|"
                     r"CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT|cu(da)?Occupancy\w+)$", re.IGNORECASE)
# The CUDA APIs whose out-parameter (`&n`) receives an SM count or an occupancy.
SM_API = re.compile(r"^(cudaDevAttrMultiProcessorCount|CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT|cu(da)?Occupancy\w+|"
                    r"cudaGetDeviceProperties)$")
GRID_TARGET = re.compile(r"grid|split|blocks|programs|ctas|waves", re.IGNORECASE)
# Float atomics in PTX (atom.global.add.f32, red.shared.add.noftz.bf16x2) and SASS (RED.E.ADD.F32.FTZ.RN).
PTX_FLOAT_ATOMIC = re.compile(r"\b(atom|red)(\.\w+)*\.(f16|bf16|f32|f64)(x2)?\b")
SASS_FLOAT_ATOMIC = re.compile(r"\b(RED|ATOM|ATOMG|ATOMS)(\.\w+)*\.(F16|BF16|F32|F64)(x2|X2|_V2)?\b")
# cuBLAS splitKreduce_kernel, cutlass *_splitk / ReduceSplitK, flash-attn splitkv, stream-K and segment-K kernels.
SPLIT_K_KERNEL = re.compile(r"split_?k|stream_?k|segment_k_on", re.IGNORECASE)
