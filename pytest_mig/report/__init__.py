"""What a run shows: tables and reports, the trend page, exports, the fleet view, sample counts."""
