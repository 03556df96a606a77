"""The simulated DGX Spark cluster (tests and demos only).

Everything under this package is SIMULATION: network namespaces with real
OpenSSH stand in for the boxes, shims stand in for the GB10 vendor tools, and
simulated engines stand in for ds41f / TensorFold / vLLM / SGLang. Nothing here
is imported by the code paths that drive real hardware.
"""
