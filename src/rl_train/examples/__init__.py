"""Example programs (installed as ``rl_train.examples``)."""
