"""Self-play: the league of players with their ratings and payoffs (`league.py`) and the
coordinator's side of it, opponents drawn, snapshots kept, evaluations scored
(`matchmaking.py`). It imports no torch.
"""
