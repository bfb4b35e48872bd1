"""Getting a checkpoint in: finding it, checking the machine, loading weights, writing tiny ones."""
