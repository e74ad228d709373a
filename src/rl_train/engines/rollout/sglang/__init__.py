"""The sglang rollout backend: an sglang server, launched or attached to, driven over HTTP only.

Nothing here imports sglang: the server is another process (``python -m sglang.launch_server``,
which needs a GPU and a CUDA torch: the ``sglang`` extra), and this package speaks its native
HTTP API (``client``). ``engine.SglangRolloutEngine`` puts the ``RolloutEngine`` contract on it.
"""
