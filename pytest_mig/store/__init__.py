"""What a site keeps: the file schemas, results files, the results checkpoint and the baseline histories."""
