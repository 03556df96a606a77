"""Files that run on the nodes themselves (pushed as single files; standard library only)."""
