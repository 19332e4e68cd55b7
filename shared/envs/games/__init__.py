"""Two-player games: the environments self-play trains on and the fixed opponents it meets."""
