"""What comes after training: a checkpoint's model loaded (trained.py), new inputs embedded (embedder.py), the one
search of nested-embedding indexes, flat / adaptive / funnel (search.py), and an index folder searched with new
queries (query.py)."""
