"""Helpers every layer uses: escaping text a user or a file gave, strict reading and atomic writing of files."""
