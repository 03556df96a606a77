"""From data to what would happen: rendered files, law verdicts, ordered steps. Pure."""
