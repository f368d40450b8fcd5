"""Side-by-side benchmarks against peers; `python -m benchmarks.run` lists and runs the tables."""
