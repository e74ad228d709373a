"""Persistent worker pools (R-1.1): Ray actors that hold the engines for a whole run.

Each worker reads its inputs from the TransferQueue by key and writes its outputs back, so
the Prefect tasks that drive them pass only keys and batch ids."""
