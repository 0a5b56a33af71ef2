# pytest-mig is loaded through its pytest11 entry point (pyproject.toml); nothing else belongs here.
