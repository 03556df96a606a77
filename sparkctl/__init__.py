"""sparkctl: launch and judge LLM serving stacks on switchless DGX Spark clusters."""

__version__ = "0.1.0"
