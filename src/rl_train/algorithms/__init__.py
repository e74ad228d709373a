"""RL algorithms as small pure functions on tensors, chosen by registered name.

Conventions shared by every module here:
- Per-token tensors are ``[B, T]`` (batch, sequence positions) and come with a
  ``response_mask`` of the same shape (1 = a token the policy generated and is graded on).
- Functions do no I/O and call no engine; they are safe to unit-test on hand-made tensors.
"""
