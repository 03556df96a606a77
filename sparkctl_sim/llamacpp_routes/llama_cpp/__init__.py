"""SIMULATION ONLY: the package path makes `python3 -m sparkctl_sim.llamacpp_routes.llama_cpp.server` match ENGINE_REGEX."""
