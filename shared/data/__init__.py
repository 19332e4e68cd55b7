"""Offline data: Minari datasets read and written as the replay's chunks."""
