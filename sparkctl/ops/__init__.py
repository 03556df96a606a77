"""The edges that change hosts: the executor of plans, the lock, check, status, weights."""
