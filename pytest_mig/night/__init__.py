"""A night's run: which tests run and in what time, the compile caches, node mode, calibrate and detection."""
