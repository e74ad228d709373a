"""The megatron-core training engine's parts (issue: scale-out backends).

- ``cpu_compat``: the small layer that lets megatron-core's own code run on a machine
  without a GPU (tests, CI), used only when CUDA is not available.
- ``hf_bridge``: the policy's HF config and weights to megatron-core's ``TransformerConfig``
  and ``GPTModel`` parameters and back (name mapping, fused QKV, gated MLP).

megatron-core is an optional extra (``rl-train[megatron]``); nothing here imports it at module
level, so this package can be imported without it.
"""
