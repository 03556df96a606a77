"""The only SSH code: fabric underneath, host keys, command wrapping, deadlines, fan-out results."""
