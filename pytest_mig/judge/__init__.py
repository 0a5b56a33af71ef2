"""Judging: a figure against its history, its reference and the ideal scaling between profiles."""
