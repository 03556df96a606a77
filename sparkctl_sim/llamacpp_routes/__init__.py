"""SIMULATION ONLY: see llama_cpp/server.py (named so that sparkctl's engine pattern, `llama_cpp.server`, finds it)."""
