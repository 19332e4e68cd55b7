"""An exact tic-tac-toe player: the fixed opponent no learned policy may lose to.

Tic-tac-toe has 5,478 legal positions, so the whole game tree is solved once by minimax with
a memo (a few milliseconds) and every move is a lookup. The board is nine cells in the order
of PettingZoo's `tictactoe_v3` actions; +1 marks the player to move, -1 the opponent.
Among equally good moves the player prefers the quickest win and the slowest loss, and picks
between ties with the caller's random generator, so it does not play one fixed game.
"""

from __future__ import annotations

from functools import cache

import numpy as np

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8),
         (2, 4, 6))

Board = tuple[int, ...]  # nine cells: +1 the player to move, -1 the opponent, 0 empty


def winner(board: Board) -> int:
    """+1 or -1 for the side with three in a row, 0 for none."""
    for a, b, c in LINES:
        if board[a] != 0 and board[a] == board[b] == board[c]:
            return board[a]
    return 0


@cache
def value(board: Board) -> int:
    """The game's value for the player to move with perfect play on both sides: +1 a win,
    0 a draw, -1 a loss, scaled by (10 - plies) so sooner wins score higher."""
    done = winner(board)
    empty = [i for i, cell in enumerate(board) if cell == 0]
    if done != 0:
        return done * (len(empty) + 1)  # done == -1 always: the opponent just moved
    if not empty:
        return 0
    return max(-value(_flip(_play(board, i))) for i in empty)


def move_values(board: Board) -> dict[int, int]:
    """Each legal move's value for the player to move."""
    return {i: -value(_flip(_play(board, i))) for i, cell in enumerate(board) if cell == 0}


def perfect_move(board: Board, rng: np.random.Generator | None = None) -> int:
    """A move no opponent can punish; a random one among the best if `rng` is given."""
    scored = move_values(board)
    if not scored:
        raise ValueError("the board is full")
    best = max(scored.values())
    moves = sorted(i for i, v in scored.items() if v == best)
    return moves[0] if rng is None else int(rng.choice(moves))


def board_from_planes(planes: np.ndarray) -> Board:
    """A board from PettingZoo's (3, 3, 2) observation: plane 0 the marks of the player to
    move, plane 1 the opponent's; cell (row, col) is action `3 * row + col`."""
    cells = [0] * 9
    for row in range(3):
        for col in range(3):
            if planes[row, col, 0]:
                cells[3 * row + col] = 1
            elif planes[row, col, 1]:
                cells[3 * row + col] = -1
    return tuple(cells)


def _play(board: Board, cell: int) -> Board:
    return board[:cell] + (1,) + board[cell + 1:]


def _flip(board: Board) -> Board:
    return tuple(-c for c in board)
