"""Worker side: the dispatch task, target calls, fenced lease writes, completion."""
