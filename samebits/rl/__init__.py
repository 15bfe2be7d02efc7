"""samebits.rl: on-policy RL whose trainer logprobs are the rollout's bits.

    rl/policy.py      Policy: the engine's forward (models/llama.py) on TrainOps, trainable, packed varlen batches
    rl/train_ops.py   TrainOps: every op's forward the engine's invariant kernel, its backward reference torch math
    rl/sampling.py    the raw and the sampling distribution's logprobs, one function for both sides
    rl/rollout.py     the engine's side: rollout logprobs from an LLM, raw or under the sampling distribution
    rl/monitor.py     ParityMonitor: bitwise-equal fraction, max |delta|, KL k1/k2/k3, importance ratios, the alarm
    rl/grpo.py        a GRPO step (group advantages, clipped ratio loss) for the demo
"""
