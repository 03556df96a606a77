"""Read-only facts about nodes: the commands that read them and the pure parsers of their output."""
