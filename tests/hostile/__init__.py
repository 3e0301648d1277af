"""Input past every bound, and values and shapes others can write, end to end."""
