"""The exact tic-tac-toe player: no opponent strategy beats it (checked over every line of
play), its values agree with OpenSpiel's alpha-beta search, and it reads PettingZoo's
observations the way the env means them."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.shared.envs.games.tictactoe import (
    Board,
    board_from_planes,
    perfect_move,
    value,
    winner,
)

EMPTY: Board = (0,) * 9


def _after(moves: list[int]) -> Board:
    """The board seen by the player to move after `moves` (alternating, first player first)."""
    cells = [0] * 9
    for i, cell in enumerate(moves):
        cells[cell] = 1 if i % 2 == 0 else -1
    if len(moves) % 2 == 1:  # the second player moves: its own marks are +1
        cells = [-c for c in cells]
    return tuple(cells)


def _worst_case(moves: list[int], perfect_first: bool) -> int:
    """The perfect player's worst result (+1, 0, -1) over every reply an opponent can make."""
    board = _after(moves)
    mover_is_perfect = (len(moves) % 2 == 0) == perfect_first
    if winner(board) != 0:  # the player who just moved won
        return -1 if mover_is_perfect else 1
    if 0 not in board:
        return 0
    if mover_is_perfect:
        return _worst_case(moves + [perfect_move(board)], perfect_first)
    return min(_worst_case(moves + [cell], perfect_first)
               for cell in range(9) if board[cell] == 0)


@pytest.mark.parametrize("perfect_first", [True, False])
def test_no_line_of_play_beats_the_perfect_player(perfect_first):
    assert _worst_case([], perfect_first) >= 0


def test_known_positions():
    assert value(EMPTY) == 0  # perfect play draws
    # X at 0 and 1, O at 3 and 4, X to move: X takes the win at 2 rather than block 5.
    assert perfect_move(_after([0, 3, 1, 4])) == 2 and value(_after([0, 3, 1, 4])) > 0
    # O must block X's 0-1-2 line at 2 or lose.
    assert perfect_move(_after([0, 4, 1])) == 2
    with pytest.raises(ValueError, match="full"):
        perfect_move(_after([0, 1, 2, 4, 3, 5, 7, 6, 8]))


def test_ties_are_broken_by_the_callers_generator():
    rng = np.random.default_rng(0)
    firsts = {perfect_move(EMPTY, rng) for _ in range(200)}
    assert len(firsts) == 9  # every opening draws


def test_values_agree_with_openspiel_alpha_beta():
    pyspiel = pytest.importorskip("pyspiel")
    from open_spiel.python.algorithms.minimax import alpha_beta_search

    game = pyspiel.load_game("tic_tac_toe")
    for a in range(9):
        for b in range(9):
            if a == b:
                continue
            state = game.new_initial_state()
            state.apply_action(a)
            state.apply_action(b)
            # OpenSpiel's value is for player 0 (the first player), who moves now.
            spiel_value, _ = alpha_beta_search(game, state=state, maximizing_player_id=0)
            assert np.sign(value(_after([a, b]))) == np.sign(spiel_value), (a, b)


def test_it_reads_pettingzoo_observations_and_never_loses_there():
    tictactoe = pytest.importorskip("pettingzoo.classic.tictactoe.tictactoe")
    rng = np.random.default_rng(1)
    results = {True: [], False: []}
    for game in range(100):
        perfect_first = game % 2 == 0
        env = tictactoe.env()
        env.reset(seed=game)
        perfect = "player_1" if perfect_first else "player_2"
        outcome = 0
        for agent in env.agent_iter():
            obs, reward, terminated, truncated, _ = env.last()
            if terminated or truncated:
                if agent == perfect:
                    outcome = int(reward)
                env.step(None)
                continue
            mask = obs["action_mask"]
            if agent == perfect:
                action = perfect_move(board_from_planes(obs["observation"]), rng)
                assert mask[action] == 1
            else:
                action = int(rng.choice(np.flatnonzero(mask)))
            env.step(action)
        results[perfect_first].append(outcome)
    for perfect_first, outcomes in results.items():
        assert min(outcomes) >= 0, perfect_first  # no loss
        assert outcomes.count(1) > len(outcomes) // 2  # and random mostly loses
